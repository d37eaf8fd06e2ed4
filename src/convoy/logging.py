"""Accelerate's ``accelerate.logging`` import path (the logger lives in ``convoy.train.logging``).

    from convoy.logging import get_logger            # was: from accelerate.logging import get_logger
    logger = get_logger(__name__, log_level="INFO")
    logger.info("on the main process only")
    logger.info("on every process, one after another", main_process_only=False, in_order=True)
"""

from convoy.train.logging import MultiProcessAdapter, get_logger

__all__ = ["get_logger", "MultiProcessAdapter"]

"""A program that logs through convoy's rank-aware logger at each level, as docs/configuration.md shows.

    python log_levels.py [--configure-first | --configure-after]

``--configure-first``: the application calls ``logging.basicConfig`` before ``get_logger`` (its level holds);
``--configure-after``: after its first messages (its handler takes over from convoy's stand-in).
"""

import logging
import sys

from convoy.train.logging import get_logger

if "--configure-first" in sys.argv:
    logging.basicConfig(format="CONFIGURED %(message)s")
logger = get_logger("app")
logger.debug("DEBUG shown")
logger.info("INFO shown")
logger.info("EVERY RANK", main_process_only=False)
logger.warning("WARNING shown")
if "--configure-after" in sys.argv:
    logging.basicConfig(format="CONFIGURED %(message)s", level=logging.INFO)
    logger.info("AFTER basicConfig")

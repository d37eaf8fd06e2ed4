"""Accelerate's ``accelerate.local_sgd`` import path (``LocalSGD`` lives in ``convoy.train.local_sgd``).

    from convoy.local_sgd import LocalSGD            # was: from accelerate.local_sgd import LocalSGD
"""

from convoy.train.local_sgd import LocalSGD

__all__ = ["LocalSGD"]

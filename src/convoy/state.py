"""Accelerate's ``accelerate.state`` import path (the states live in ``convoy.train.process_view``).

    from convoy.state import AcceleratorState, PartialState   # was: from accelerate.state import ...
"""

from convoy.train.process_view import AcceleratorState, DistributedType, GradientState, PartialState

__all__ = ["AcceleratorState", "PartialState", "GradientState", "DistributedType"]

"""Fixtures of the trainer's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def accelerator_in_this_process():
    """For a test that builds an ``Accelerator`` in the test process: Accelerate's process-wide state fresh before and
    after it, and the process group that Accelerator started stopped (the suite's leak check fails a test that leaves
    one)."""
    from convoy import PartialState
    from convoy.train.process_group import stop_process_group

    PartialState._reset_state()
    yield
    PartialState._reset_state()
    stop_process_group()

"""The contract every parser and file reader keeps, for property-based tests: one convoy error or a result.

    from tests.bounded import BOUNDED, outcome
    @BOUNDED
    @given(text=st.text())
    def test_parse(text):
        result = outcome(parse_devices, text, 8)     # the result, or the ConvoyError it raised
        assert isinstance(result, (list, ConvoyError))

``outcome`` calls the function under ``tracemalloc`` and fails the test when it raises anything but a
``ConvoyError`` (a traceback reaching the user) or allocates more than ``MAX_PEAK_BYTES`` at once (a request
expanded before it was checked). ``BOUNDED`` is the hypothesis profile: few examples (the suite stays fast)
and a deadline per example (no input may take long).
"""

from __future__ import annotations

import datetime
import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings

from convoy.errors import ConvoyError

#: no parser may hold more than this at once, whatever the input (the inputs themselves are far smaller).
MAX_PEAK_BYTES = 64 * 2**20

#: hypothesis settings of every input property test: 200 examples, each within 2 s (the machine is shared).
BOUNDED = settings(max_examples=200, deadline=datetime.timedelta(seconds=2),
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or the ``ConvoyError`` it raised; any other exception fails the test."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        return fn(*args, **kwargs)
    except ConvoyError as err:
        message = str(err)
        assert message and "\n" not in message.strip(), f"a convoy error must be one line: {message!r}"
        return err
    finally:
        _, peak = tracemalloc.get_traced_memory()
        if started:
            tracemalloc.stop()
        assert peak < MAX_PEAK_BYTES, f"{getattr(fn, '__name__', fn)} held {peak / 2**20:.0f} MiB at once"

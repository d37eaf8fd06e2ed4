"""Property-based tests: ``convoy launch``'s flags, and the launch request they build, are refused in the parent
with one ``convoy:`` line or accepted, never another exception, in bounded time and memory; no rank starts
(``--dry-run``)."""

from __future__ import annotations

import contextlib
import io
import os
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from convoy.cli.main import main
from convoy.errors import ConvoyError
from convoy.launch.rank_env import ConvoyEnv
from convoy.launch.resolve import LaunchRequest
from tests.bounded import BOUNDED, outcome
from tests.conftest import INVENTORIES

_FLAGS = st.sampled_from([
    "--devices", "--min-free-memory", "--max-utilization", "--exclude", "--wait", "--nproc-per-node",
    "--num_processes", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-conf", "--max-restarts",
    "--monitor-interval", "--mixed-precision", "--strategy", "--dp", "--tp", "--pp", "--gradient-accumulation-steps",
    "--collective-timeout", "--engine", "--rdzv-backend", "--recompute",
])
_VALUES = st.one_of(
    st.sampled_from(["0", "1", "2", "-1", "70000", "inf", "nan", "fp8", "bf16", "ddp", "bogus", "auto", "all", "²",
                     "٣", "--1", "a", "0,0", "1:2", "5m", "1e400", "9" * 300, "c10d", "x=1", "", "GPU-", "full",
                     "selective"]),
    st.text("0123456789-,:.aeinf", max_size=8),
)


@BOUNDED
@given(flags=st.lists(st.tuples(_FLAGS, _VALUES), max_size=3), gpus=st.booleans())
def test_launch_flags(flags, gpus):
    inventory = INVENTORIES / ("8xh100_nvswitch.json" if gpus else "2_busy_exclusive.json")
    argv = ["launch", "--dry-run"] + [f"{flag}={value}" for flag, value in flags] + ["train.py"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOY_", "SLURM_", "CUDA_"))}
    err = io.StringIO()
    with mock.patch.dict(os.environ, {**env, "CONVOY_INVENTORY": str(inventory)}, clear=True), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    assert code in (0, 1, 2), err.getvalue()
    numeric = {"--max-utilization", "--nproc-per-node", "--num_processes", "--nnodes", "--node-rank", "--master-port",
               "--max-restarts", "--dp", "--tp", "--pp", "--gradient-accumulation-steps", "--collective-timeout"}
    if any(flag in numeric and not value.isascii() for flag, value in flags):
        assert code == 2, "a number with non-ASCII digits must be refused, not read as another number"
    if code:
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("convoy: "), err.getvalue()


_SETTINGS = st.one_of(st.none(), _VALUES, st.integers(-2, 10**20), st.floats())


@BOUNDED
@given(mixed=_SETTINGS, strategy=_SETTINGS, steps=_SETTINGS, timeout=_SETTINGS, parallelism=_SETTINGS,
       port=st.one_of(st.none(), st.integers(-2, 70000)))
def test_launch_request(mixed, strategy, steps, timeout, parallelism, port):
    settings = outcome(ConvoyEnv, mixed_precision=mixed, strategy=strategy, gradient_accumulation_steps=steps,
                       collective_timeout=timeout, parallelism=parallelism)
    if isinstance(settings, ConvoyEnv):  # what the parent accepts, every rank accepts: the trainer's own parsers
        from convoy.config.schema import BUILTIN_STRATEGIES, MIXED_PRECISIONS

        assert settings.mixed_precision in (None, *MIXED_PRECISIONS)
        assert settings.strategy is None or isinstance(settings.strategy, str)  # a script may register its own
        assert settings.collective_timeout is None or 0 < settings.collective_timeout < float("inf")
        request = outcome(LaunchRequest, program=("train.py",), master_port=port, settings=settings)
        assert isinstance(request, (LaunchRequest, ConvoyError))
        if isinstance(request, LaunchRequest):  # the launcher itself keeps to convoy's strategies
            assert request.settings.strategy in (None, *BUILTIN_STRATEGIES)


_SLURM = st.one_of(st.text("0123456789-,[]ab²٣", max_size=16),
                   st.sampled_from(["a[0-99999999999]", "a[0-65535]b[0-65535]", "n[1-3,5]", "x[٣-5]", ""]))


@BOUNDED
@given(nodelist=_SLURM, nnodes=st.one_of(st.none(), _VALUES), node=st.one_of(st.none(), _VALUES),
       tasks=st.one_of(st.none(), _VALUES))
def test_slurm_variables(nodelist, nnodes, node, tasks):
    from convoy.launch.slurm import SlurmAllocation, slurm_allocation

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": nodelist}
    for key, value in (("SLURM_NNODES", nnodes), ("SLURM_NODEID", node), ("SLURM_NTASKS_PER_NODE", tasks)):
        if value is not None:
            env[key] = value
    result = outcome(slurm_allocation, env)
    assert result is None or isinstance(result, (SlurmAllocation, ConvoyError))

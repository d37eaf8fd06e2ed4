"""Accelerate 1.15's own shipped test scripts, run against convoy on 2 CPU processes under ``convoy launch``.

Only the scripts' import lines change (``runner.py``): the library is convoy, Accelerate's fixtures stay.
One pytest item per check call, so a report reads per check. Each script is launched once (module cache);
the whole suite takes about a minute on 2 cores. Checks that Accelerate itself only runs with GPUs are
skipped here with the reason.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

import pytest

from tests import processes
from tests.distributed import REPO, Result, cpu_env, run_script

accelerate = pytest.importorskip("accelerate")
RUNNER = Path(__file__).parent / "runner.py"
SCRIPTS = Path(accelerate.__file__).parent / "test_utils" / "scripts"

_MULTI_GPU = ("Accelerate runs it only when distributed_type is MULTI_GPU (or another multi-accelerator type); "
              "test_accelerates_gpu_only_sync_check_passes_under_convoy_on_cpu calls it on CPU")
_NO = "Accelerate runs it only with one process (distributed_type NO); this suite runs 2 processes"

# script -> the check calls main() makes on 2 CPU processes (label = function#call)
EXPECTED: dict[str, list[str]] = {
    "test_ops.py": [
        "test_gather#1", "test_gather_object#1", "test_gather_non_contiguous#1", "test_broadcast#1",
        "test_pad_across_processes#1", "test_reduce_sum#1", "test_reduce_mean#1", "test_reduce_max#1",
        "test_op_checker#1", "test_copy_tensor_to_devices#1"],
    "test_sync.py": [
        "test_dataloader_break#1", "test_distributed_sync#1", "test_distributed_sync_multiple_fwd#1",
        "test_gradient_accumulation_with_opt_and_scheduler#1"],
    "test_script.py": [
        "init_state_check#1", "process_execution_check#1", "test_split_between_processes_list#1",
        "test_split_between_processes_nested_dict#1", "test_split_between_processes_tensor#1",
        "test_split_between_processes_evenly#1", "rng_sync_check#1", "dl_preparation_check#1",
        "central_dl_preparation_check#1", "custom_sampler_check#1", "check_seedable_sampler#1",
        "check_seedable_sampler_with_data_seed#1", "check_seedable_sampler_in_batch_sampler_shard#1",
        "training_check#1", "training_check#2", "test_trigger#1", "test_reinstantiated_state#1"],
    "test_distributed_data_loop.py": [
        "test_default_ensures_even_batch_sizes#1", "test_can_disable_even_batches#1",
        "test_can_join_uneven_inputs#1", "test_join_can_override_even_batches#1",
        "test_join_can_override_for_mixed_type_dataloaders#1",
        "test_join_raises_warning_for_iterable_when_overriding_even_batches#1",
        "test_join_raises_warning_for_non_ddp_distributed#1", "test_pickle_accelerator#1",
        "test_data_loader#1", "test_data_loader#2", "test_data_loader#3", "test_data_loader#4",
        "test_stateful_dataloader#1", "test_stateful_dataloader_save_state#1"],
    "test_notebook.py": [
        "test_can_initialize#1", "test_clean_cuda_fork#1", "test_static_rdzv_backend#1", "test_c10d_rdzv_backend#1",
        "test_fault_tolerant#1"],
    "external_deps/test_metrics.py": [
        "test_torch_metrics#1", "test_torch_metrics#2", "test_torch_metrics#3", "test_torch_metrics#4",
        "test_torch_metrics#5", "test_gather_for_metrics_drop_last#1"],
}

# checks that need an optional package: skipped without it, as Accelerate's own suite skips them
# (accelerate.test_utils.require_torchdata_stateful_dataloader); the script calls them either way
NEEDS: dict[str, str] = {"test_stateful_dataloader#1": "torchdata.stateful_dataloader",
                         "test_stateful_dataloader_save_state#1": "torchdata.stateful_dataloader"}

# scripts that start their own processes (notebook_launcher): run by plain python, ACCELERATE_NUM_PROCESSES=2
PLAIN = {"test_notebook.py"}
ELAPSED: dict[str, float] = {}  # seconds each PLAIN script took

# checks that fail under convoy by design: (label, what convoy raises instead, why)
DIFFERENT: dict[str, list[tuple[str, str, str]]] = {
    "test_notebook.py": [("test_monitoring#1", "RuntimeError: I'm an even process. I don't like to sleep.",
                          "convoy raises the failing rank's own exception (its rank and traceback attached), where "
                          "Accelerate wraps it in torch's ChildFailedError (docs/migrating.md)")],
}

# checks main() does not call on 2 CPU processes, and why
NOT_ON_CPU: dict[str, list[tuple[str, str]]] = {
    "test_sync.py": [("test_noop_sync", _NO)]
    + [(f"test_gradient_accumulation (split_batches, dispatch_batches, sync_each_batch) #{i}", _MULTI_GPU)
       for i in range(1, 9)]
    + [(f"test_gradient_accumulation_with_opt_and_scheduler #{i}", _MULTI_GPU) for i in range(2, 9)],
    "test_ddp_comm_hook.py": [(f"test_ddp_comm_hook #{i}", "its reference is DistributedDataParallel(device_ids="
                               "[local rank]), which needs a GPU per process (Accelerate runs it on several GPUs); "
                               "tests/train/test_scripts.py::test_ddp_communication_hooks_match_plain_ddp makes the "
                               "same comparison on CPU processes") for i in range(1, 11)],
    "test_script.py": [("test_split_between_processes_dataset",
                        "needs the `datasets` package, which is not installed; the script prints 'Skipped'")],
    "external_deps/test_metrics.py": [(f"test_mrpc #{i}", "Accelerate runs it only on a GPU (needs transformers, "
                                       "datasets, evaluate and a download)") for i in range(1, 5)]
    + [("test_gather_for_metrics_with_iterable_dataset", "Accelerate runs it only on a GPU"),
       ("test_gather_for_metrics_with_non_tensor_objects_iterable_dataset", "Accelerate runs it only on a GPU")],
}

# test_sync.py's checks main() calls only on GPUs, called here on CPU as main() calls them there (after main):
# convoy runs them too. Reported as name#n after the CPU path's calls; not among Accelerate's 51 checks.
_FLAGS = [(a, b, c) for a in (True, False) for b in (True, False) for c in (True, False)]
SYNC_EXTRA_CALLS = [f"test_gradient_accumulation({a}, {b}, {c})" for a, b, c in _FLAGS] + [
    f"test_gradient_accumulation_with_opt_and_scheduler({a}, {b}, {c})" for a, b, c in _FLAGS if a or b or c]
SYNC_EXTRA = [f"test_gradient_accumulation#{i}" for i in range(1, 9)] + [
    f"test_gradient_accumulation_with_opt_and_scheduler#{i}" for i in range(2, 9)]

_LINE = re.compile(r"@@check (\S+) rank=(\d+) (PASS|FAIL) ?(.*)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


@cache
def _results(script: str) -> tuple[dict[str, dict[int, str]], str]:
    """label -> {rank: "PASS" or the failure}, and the launch's output (one launch per script)."""
    with tempfile.TemporaryDirectory() as scratch:  # test_script.py writes a file into its working directory
        extra = [a for call in SYNC_EXTRA_CALLS for a in ("--extra", call)] if script == "test_sync.py" else []
        if script in PLAIN:
            started = time.monotonic()
            done = processes.run([sys.executable, str(RUNNER), script], capture_output=True, text=True,
                                 timeout=240, cwd=scratch, env=cpu_env({"ACCELERATE_NUM_PROCESSES": "2"}))
            result = Result(done.returncode, done.stdout + done.stderr)
            ELAPSED[script] = time.monotonic() - started
        else:
            result = run_script(RUNNER, nproc=2, args=[script, *extra], env={"CONVOY_COLLECTIVE_TIMEOUT": "20"},
                                timeout=240, cwd=scratch)
    checks: dict[str, dict[int, str]] = {}
    for match in _LINE.finditer(result.output):
        label, rank, status, reason = match.groups()
        checks.setdefault(label, {})[int(rank)] = "PASS" if status == "PASS" else reason
    return checks, result.output


@pytest.mark.slow
@pytest.mark.parametrize("script,label", [(s, c) for s, labels in EXPECTED.items() for c in labels])
def test_accelerate_check_passes_under_convoy(script, label):
    if label in NEEDS and not _installed(NEEDS[label]):
        pytest.skip(f"{script}: {label} needs {NEEDS[label]}, which is not installed (pip install torchdata)")
    checks, output = _results(script)
    per_rank = checks.get(label)
    assert per_rank is not None, f"{script}: {label} never ran; the script stopped before it:\n{output[-3000:]}"
    failures = {rank: why for rank, why in per_rank.items() if why != "PASS"}
    ranks = [0] if script in PLAIN else [0, 1]  # a plain script's checks run in the parent, rank 0 of none
    assert not failures and sorted(per_rank) == ranks, f"{script}: {label} failed: {failures or per_rank}"


@pytest.mark.slow
@pytest.mark.parametrize("script,label,raised,why", [(s, *d) for s, items in DIFFERENT.items() for d in items])
def test_accelerate_check_convoy_answers_differently_by_design(script, label, raised, why):
    checks, output = _results(script)
    assert checks.get(label) == {0: raised}, f"{script}: {label}: {checks.get(label)} ({why})"
    if label == "test_monitoring#1":  # the sleeping rank was stopped, not waited for (it sleeps 100 s)
        assert ELAPSED[script] < 60, ELAPSED[script]


@pytest.mark.slow
@pytest.mark.parametrize("label", SYNC_EXTRA)
def test_accelerates_gpu_only_sync_check_passes_under_convoy_on_cpu(label):
    test_accelerate_check_passes_under_convoy("test_sync.py", label)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_no_check_runs_that_the_suite_does_not_know(script):
    checks, _ = _results(script)
    known = EXPECTED[script] + (SYNC_EXTRA if script == "test_sync.py" else []) + [
        label for label, *_ in DIFFERENT.get(script, ())]
    assert sorted(set(checks) - set(known)) == []


@pytest.mark.parametrize("script,check,reason", [(s, c, r) for s, items in NOT_ON_CPU.items() for c, r in items])
def test_check_accelerate_runs_only_elsewhere(script, check, reason):
    pytest.skip(f"{script}::{check}: {reason}")


def test_rewrite_takes_the_library_from_convoy_and_only_fixtures_from_accelerate():
    sys.path.insert(0, str(REPO))
    from tests.train.conformance.runner import rewrite

    source = (SCRIPTS / "test_script.py").read_text()
    new = rewrite(source)
    imports = [n for n in ast.parse(new).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    from_accelerate = {a.name for n in imports if isinstance(n, ast.ImportFrom) and n.module.startswith("accelerate")
                       for a in n.names}
    assert from_accelerate == {"RegressionDataset", "RegressionModel", "are_the_same_tensors"}
    assert "_cf.library_name('Accelerator')" in new and "_cf.library_name('AcceleratorState')" in new
    assert len(new.splitlines()) == len(source.splitlines()) + 1  # line numbers of tracebacks still match


def test_accelerate_itself_refuses_to_run_in_the_child():
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from tests.train.conformance.runner import poison_accelerate\n"
            "poison_accelerate()\n"
            "import accelerate, accelerate.utils.operations as ops\n"
            "for call in (accelerate.Accelerator, accelerate.PartialState, ops.gather):\n"
            "    try: call()\n"
            "    except AssertionError as e: print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.count("REFUSED") == 3, out.stdout + out.stderr
    assert "the library under test is convoy" in out.stdout

"""Suite-wide fixtures: one hermetic environment for the session, hygiene checks after every test, the ``gpu``
marker, and paths to test data.

The suite gives the same result on a CPU box, a 1-GPU box and an 8-GPU box, whatever the shell exports:

* before collection, the variables that change what convoy, torch or the launcher do are removed from
  ``os.environ`` for the whole session (``SCRUBBED``, every ``CONVOY_*``, ``TORCHELASTIC_*``, ``SLURM_*``,
  ``ACCELERATE_*``, torchrun's ``PET_*``), leases go to a temporary ``CONVOY_LEASE_DIR``, and
  ``HOME``/``XDG_CONFIG_HOME`` point at a temporary directory so the user's settings file is not read (nor their
  calibration cache written: without ``XDG_CACHE_HOME`` it is under that ``HOME``), and the session works in an
  empty temporary directory, so a project settings file (``./convoy.toml``) where pytest was started is not read
  either;
* after each test, a test that leaves a lease held, a process running (stopped, then reported), a watched
  variable or the working directory changed fails, and the process's ``AcceleratorState`` is reset (it is
  process-wide, as Accelerate's);
* ``@pytest.mark.gpu`` tests run only where ``torch.cuda.is_available()`` (asked in a fresh process, so the
  test runner never touches CUDA itself) and are skipped cleanly elsewhere.

``pytest --simulate-inventory tests/inventories/8xh100_nvswitch.json`` sets ``CONVOY_INVENTORY`` for the
session after the scrub: every ``convoy launch`` a test starts then sees eight GPUs, which is how a GPU box
looks to the launcher; tests that mean "CPU processes" must still pass (they ask for them explicitly).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import processes

TESTS = Path(__file__).parent
INVENTORIES = TESTS / "inventories"
REPO = TESTS.parent

# Exact names removed from the session's environment (prefixes below): device visibility of every vendor,
# torchrun's rank contract, thread counts the launcher would otherwise keep.
SCRUBBED = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER", "HABANA_VISIBLE_MODULES",
    "HABANA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "PYTORCH_NVML_BASED_CUDA_CHECK", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
)
SCRUBBED_PREFIXES = ("CONVOY_", "TORCHELASTIC_", "SLURM_", "ACCELERATE_", "PET_")  # PET_: torchrun's options

# Variables a test must never leave behind in this process: they would change what later tests see.
_WATCHED = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK", "CONVOY_INVENTORY", "CONVOY_LEASE_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
)

_session: dict[str, object] = {}


def pytest_addoption(parser):
    parser.addoption("--simulate-inventory", default=None, metavar="FILE",
                     help="set CONVOY_INVENTORY=FILE for the session (after the scrub): launches see that machine")


def scrub_environment(environ, *, simulate_inventory: str | None = None) -> dict[str, str]:
    """Make ``environ`` hermetic (see the module docstring); returns what was removed or replaced."""
    removed = {key: environ.pop(key) for key in list(environ)  # CONVOY_TEST_* are the suite's own knobs
               if (key in SCRUBBED or key.startswith(SCRUBBED_PREFIXES)) and not key.startswith("CONVOY_TEST_")}
    scratch = Path(tempfile.mkdtemp(prefix="convoy-tests-"))
    for name in ("leases", "home", "home/.config"):
        (scratch / name).mkdir(exist_ok=True)
    removed.setdefault("HOME", environ.get("HOME", ""))
    environ["HOME"] = str(scratch / "home")
    environ["XDG_CONFIG_HOME"] = str(scratch / "home" / ".config")
    environ["CONVOY_LEASE_DIR"] = str(scratch / "leases")
    if simulate_inventory:
        environ["CONVOY_INVENTORY"] = str(Path(simulate_inventory).resolve())
    _session["scratch"] = scratch
    return removed


def pytest_configure(config):
    # Before collection: test modules that copy os.environ at import time see the clean one.
    if "removed" not in _session:
        _session["removed"] = scrub_environment(os.environ,
                                                simulate_inventory=config.getoption("--simulate-inventory"))
        # convoy reads the project's settings from ./convoy.toml: the session works where there is none (pytest
        # has read its arguments already, relative to where it was started). pytest-xdist's controller runs no
        # test and starts its workers in its own directory, where they read the same arguments: it stays.
        if not (getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")):
            _session["started_in"] = os.getcwd()
            work = _session["scratch"] / "work"
            work.mkdir()
            os.chdir(work)


def pytest_unconfigure(config):
    scratch = _session.get("scratch")
    if "started_in" in _session:
        os.chdir(_session["started_in"])
    if isinstance(scratch, Path):
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment():
    """The session's scrubbed environment (done in ``pytest_configure``, before collection); its scratch dir."""
    assert "removed" in _session, "tests/conftest.py's pytest_configure did not run"
    return _session["scratch"]


def held_leases(lock_dir: Path) -> list[str]:
    """Lock files in ``lock_dir`` that some process holds now (a released lease leaves an unlocked file)."""
    held = []
    for path in sorted(lock_dir.glob("*.lock")) if lock_dir.is_dir() else ():
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(f"{path.name}: {path.read_text(errors='replace')[:200]}")
        finally:
            os.close(fd)
    return held


def _cuda_available() -> bool:
    """``torch.cuda.is_available()`` in a fresh process (this one must not initialise CUDA before tests fork)."""
    if "cuda" not in _session:
        try:
            out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                                 capture_output=True, text=True, timeout=120)
            _session["cuda"] = out.stdout.strip().endswith("True")
        except (OSError, subprocess.TimeoutExpired):
            _session["cuda"] = False
    return bool(_session["cuda"])


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False here); run `make test-gpu` "
                                   "on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leaks():
    """Fail a test that leaks variables, a live process group, a running process or a held lease."""
    before = {k: os.environ.get(k) for k in _WATCHED}
    cwd = os.getcwd()
    yield
    leaked = {k: os.environ.get(k) for k in _WATCHED if os.environ.get(k) != before[k]}
    moved = os.getcwd() if os.getcwd() != cwd else None
    if moved:
        os.chdir(cwd)
    for k, v in before.items():  # restore, so one leak does not cascade into other failures
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    dist = sys.modules.get("torch.distributed")
    live_group = bool(dist and dist.is_available() and dist.is_initialized())
    if live_group:
        dist.destroy_process_group()
    stopped = processes.stop_started()
    children = processes.live_children()
    for pid in children:
        processes.stop_tree(pid, grace=1.0)
    leases = held_leases(Path(os.environ["CONVOY_LEASE_DIR"]))
    assert not leaked, f"test leaked environment variables: {leaked}"
    assert not moved, f"test left the working directory changed to {moved} (monkeypatch.chdir restores it)"
    assert not live_group, "test left a torch.distributed process group initialised"
    assert not stopped, f"test left started processes running (stopped now): {stopped}"
    assert not children, f"test left child processes running (stopped now): {children}"
    assert not leases, f"test left device leases held in {os.environ['CONVOY_LEASE_DIR']}: {leases}"


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """Each test starts without an ``AcceleratorState``, as a new process does: the state is process-wide (as
    Accelerate's), and a test's ``Accelerator(mixed_precision="bf16")`` would otherwise set the next test's
    precision (an ``Accelerator()`` there keeps it, one asking for another is refused)."""
    yield
    state = sys.modules.get("convoy.train.process_view")  # only where a test loaded it: no torch import here
    if state is not None:
        state.PartialState._reset_state()


@pytest.fixture
def inventory_path():
    """Path of a shipped inventory file by stem: ``inventory_path("8xh100_nvswitch")``."""

    def get(name: str) -> Path:
        path = INVENTORIES / f"{name}.json"
        assert path.exists(), f"no inventory {path}"
        return path

    return get

"""Suite-wide fixtures: hygiene checks every test gets, the ``gpu`` marker, and paths to test data."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
INVENTORIES = TESTS / "inventories"
REPO = TESTS.parent

# Variables a test must never leave behind in this process: they would change what later tests see.
_WATCHED = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "CONVOY_INVENTORY",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leaks():
    """Fail a test that leaks visibility/rank variables or a live process group."""
    before = {k: os.environ.get(k) for k in _WATCHED}
    yield
    leaked = {k: os.environ.get(k) for k in _WATCHED if os.environ.get(k) != before[k]}
    for k, v in before.items():  # restore, so one leak does not cascade into other failures
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    dist = sys.modules.get("torch.distributed")
    live_group = bool(dist and dist.is_available() and dist.is_initialized())
    if live_group:
        dist.destroy_process_group()
    assert not leaked, f"test leaked environment variables: {leaked}"
    assert not live_group, "test left a torch.distributed process group initialised"


@pytest.fixture
def inventory_path():
    """Path of a shipped inventory file by stem: ``inventory_path("8xh100_nvswitch")``."""

    def get(name: str) -> Path:
        path = INVENTORIES / f"{name}.json"
        assert path.exists(), f"no inventory {path}"
        return path

    return get

"""``convoy env``: every section present, failures contained per section, visibility origins, text and JSON."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import pytest

from convoy.cli.main import main
from convoy.config.report import collect_report, format_report, visibility_origins

HAS_DISCOVERY = importlib.util.find_spec("convoy.devices.discovery") is not None
SECTIONS = ["convoy", "system", "packages", "torch", "driver", "devices", "visibility", "distributed_variables",
            "settings"]


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    for name in ("CONVOY_CONFIG", "CONVOY_STRATEGY", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_json_has_every_section_with_torch_builds(clean_env, capsys, monkeypatch):
    import torch

    monkeypatch.setenv("CONVOY_STRATEGY", "zero2")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == SECTIONS
    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["cuda_build"] == torch.version.cuda
    assert "gloo" in report["torch"]["distributed_backends"]
    assert report["system"]["python"] == ".".join(map(str, sys.version_info[:3]))
    # the installed distribution's version (pip's metadata): PyPI's CUDA wheels say "2.11.0" while
    # torch.__version__ says "2.11.0+cu130"; the CPU wheel has "+cpu" in both. Same release either way.
    assert report["packages"]["torch"] == importlib.metadata.version("torch")
    assert report["packages"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert report["settings"]["values"]["strategy"] == {"value": "zero2", "source": "environment CONVOY_STRATEGY"}
    assert report["distributed_variables"]["NCCL_DEBUG"] == "INFO"
    assert set(report["driver"]) & {"nvidia", "error"}


def test_broken_parts_are_reported_not_raised(clean_env, capsys):
    (clean_env / "convoy.toml").write_text("strategy = ddp\n")  # not TOML: a bare word
    assert main(["env", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "settings:\n  unavailable: ConfigError:" in out and "convoy.toml, line 1" in out
    assert "torch:\n  skipped: --no-torch" in out


@pytest.mark.skipif(not HAS_DISCOVERY, reason="convoy.devices.discovery has not landed yet")
def test_device_table_from_an_inventory_file(clean_env, monkeypatch):
    inventory = clean_env / "box.json"
    inventory.write_text(json.dumps({"devices": [
        {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3", "vendor": "nvidia",
         "pci_bus_id": f"0000:{i:02x}:00.0", "memory_total_mib": 81559, "memory_used_mib": 10 * i,
         "utilization_pct": 5 * i, "compute_capability": "9.0", "compute_mode": "default", "processes": [],
         "nvlink_peers": []} for i in range(2)]}))
    report = collect_report(env={"CONVOY_INVENTORY": str(inventory), "HOME": str(clean_env)}, include_torch=False)
    devices = report.to_dict()["devices"]
    assert [d["index"] for d in devices["devices"]] == [0, 1]
    text = format_report(report)
    assert "NVIDIA H100 80GB HBM3" in text and "10/81559" in text


@pytest.mark.parametrize(("env", "origin"), [
    ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "2,3"}, "Slurm (job 77"),
    ({"CUDA_VISIBLE_DEVICES": "1", "TORCHELASTIC_RUN_ID": "x", "CONVOY_STRATEGY": "ddp"}, "convoy launch"),
    ({"CUDA_VISIBLE_DEVICES": "1", "TORCHELASTIC_RUN_ID": "x"}, "torchrun worker"),
    ({"HIP_VISIBLE_DEVICES": "0", "PBS_JOBID": "9.pbs"}, "PBS (job 9.pbs)"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, "container runtime"),
    ({"ZE_AFFINITY_MASK": "0.1"}, "your shell"),
])
def test_visibility_origins(env, origin):
    found = visibility_origins(env)
    assert len(found) == 1
    (name, entry), = found.items()
    assert entry["value"] == env[name] and origin in entry["origin"]


def test_text_lists_visibility_and_settings(clean_env):
    report = collect_report(env={"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                 "HOME": str(clean_env), "CONVOY_MAX_RESTARTS": "2"}, include_torch=False)
    text = format_report(report)
    assert "  CUDA_VISIBLE_DEVICES=1,0  (set before convoy started" in text
    assert "  max_restarts = 2  (environment CONVOY_MAX_RESTARTS)" in text


def test_help_and_bad_flag():
    ok = subprocess.run([sys.executable, "-m", "convoy", "env", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "examples:" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "convoy", "env", "--jsn"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--jsn" in bad.stderr

"""What a job measured on this machine refines later plans of the same case there, and leaves every other alone."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from convoy.cli.main import main
from convoy.devices.inventory import load_inventory
from convoy.plan.api import format_plan, plan, plan_for
from convoy.plan.hardware import parse_hardware
from convoy.plan.model import from_hf_config
from convoy.plan.run import RunSpec
from convoy.plan.speed.observed import Observation, case_key, observations_for, observations_here, observed_in
from convoy.plan.speed.records import Calibration, cached_records, load_calibration, save_calibration

CONFIGS = Path(__file__).parent / "configs"
INVENTORIES = Path(__file__).parents[1] / "inventories"
GPT2 = from_hf_config(CONFIGS / "gpt2.json")
RUN = RunSpec(seq_len=1024, micro_batch=8, precision="bf16")
HW = parse_hardware("2xH100-80GB")
H100_UUID = "GPU-47eaa099-2cb6-416d-86dc-283cf0480ff9"  # the first device of tests/inventories/8xh100_nvswitch.json


def _seen(measured_s: float, planned_s: float = 1.0, at: float = 1.7e9) -> Observation:
    return Observation(measured_s=measured_s, planned_s=planned_s, planned_bytes=10**9, measured_bytes=2 * 10**9,
                       rates="profile", steps=5, at=at)


def _key(p, name: str) -> str:
    return case_key(GPT2, RUN, p.row(name).candidate.layout, HW)


def test_an_observed_case_takes_the_measured_step_time_and_no_other_changes():
    first = plan_for(GPT2, RUN, HW)
    zero3 = first.row("zero3").time.seconds
    seen = _seen(measured_s=zero3 * 1.7, planned_s=zero3)
    second = plan_for(GPT2, RUN, HW, observed={_key(first, "zero3"): seen})
    assert second.row("zero3").time.seconds == pytest.approx(seen.measured_s, rel=1e-12)
    assert second.row("zero3").time.correction == pytest.approx(1.7)
    assert second.row("zero3").time.compute == first.row("zero3").time.compute  # the breakdown stays the model's
    for before, after in zip(first.rows, second.rows):
        if before.name != "zero3":
            assert after.time.seconds == before.time.seconds and after.time.correction == 1.0
        assert after.memory == before.memory  # memory is shown, not corrected
    assert dict(second.observations) == {"zero3": seen} and not first.observations
    assert "corrected by a measurement of this job on this machine" in second.time_note
    assert "corrected" not in first.time_note
    zero3_line = next(line for line in format_plan(second).splitlines() if line.startswith("zero3 "))
    assert "*" in zero3_line and "*" not in next(line for line in format_plan(first).splitlines()
                                                 if line.startswith("zero3 "))
    assert second.as_dict()["time_model"]["observed"]["zero3"]["measured_s"] == seen.measured_s


def test_a_measurement_can_change_the_recommendation():
    first = plan_for(GPT2, RUN, HW)
    chosen = first.recommendation.row.name
    other = next(r for r in first.rows if r.fits and r.name != chosen)
    faster = _seen(measured_s=first.recommendation.row.time.seconds / 3)
    second = plan_for(GPT2, RUN, HW, observed={_key(first, other.name): faster})
    assert second.recommendation.row.name == other.name


@pytest.mark.parametrize("change", [
    {"run": replace(RUN, seq_len=2048)}, {"run": replace(RUN, micro_batch=4)},
    {"run": replace(RUN, precision="bf16-fsdp")}, {"run": replace(RUN, optimizer="sgd")},
    {"run": replace(RUN, recompute="full")}, {"hw": parse_hardware("4xH100-80GB")},
    {"hw": parse_hardware("2xH100-80GB", nodes=2)},
])
def test_another_case_is_left_alone(change):
    run, hw = change.get("run", RUN), change.get("hw", HW)
    first = plan_for(GPT2, RUN, HW)
    observed = {_key(first, "zero3"): _seen(measured_s=123.0)}
    other = plan_for(GPT2, run, hw, observed=observed, global_batch=RUN.micro_batch * hw.world_size)
    assert not other.observations and all(r.time.correction == 1.0 for r in other.rows)


def test_the_case_is_the_model_not_its_name():
    as_dict = from_hf_config(json.loads((CONFIGS / "gpt2.json").read_text()))
    assert as_dict.name != GPT2.name
    layout = plan_for(GPT2, RUN, HW).row("ddp").candidate.layout
    assert case_key(as_dict, RUN, layout, HW) == case_key(GPT2, RUN, layout, HW)
    other = from_hf_config(CONFIGS / "pythia_160m.json")
    assert case_key(other, RUN, layout, HW) != case_key(GPT2, RUN, layout, HW)


def test_observations_are_kept_beside_the_rates_and_read_back(tmp_path):
    path = tmp_path / "calibration.json"
    ident = dict(device_name="NVIDIA H100 80GB HBM3", device_uuid=H100_UUID, torch_version="2.13.0")
    rates = Calibration(**ident, gemm_flops={"8x8x8:bf16": 1e12}, memory_bytes_per_s=3e12, measured_at=1.7e9)
    save_calibration(rates, path=path)
    key = _key(plan_for(GPT2, RUN, HW), "zero3")
    save_calibration(Calibration(**ident, observed={key: _seen(0.2).as_dict()}), path=path)  # what a job writes
    record = load_calibration(**ident, path=path)
    assert record.has_rates and record.gemm_flops == rates.gemm_flops and record.measured_at == 1.7e9
    assert observed_in(record) == {key: _seen(0.2)}
    only = Calibration(**{**ident, "device_uuid": "GPU-other"}, observed={key: _seen(0.3).as_dict()})
    save_calibration(only, path=path)
    assert not load_calibration(**{**ident, "device_uuid": "GPU-other"}, path=path).has_rates
    assert len(cached_records(path=path)) == 2


def test_an_older_record_and_damaged_observations_are_read_without_them(tmp_path):
    path = tmp_path / "calibration.json"
    ident = dict(device_name="NVIDIA H100 80GB HBM3", device_uuid=H100_UUID, torch_version="2.13.0")
    old = Calibration(**ident, memory_bytes_per_s=3e12).as_dict()
    del old["observed"]  # a record written before observations existed: same FORMAT, read as it was
    path.write_text(json.dumps({Calibration(**ident).key: old}))
    assert load_calibration(**ident, path=path).observed == {}
    good = _seen(0.2).as_dict()
    damaged = {"a": good, "b": {**good, "measured_s": 0}, "c": {**good, "measured_s": "fast"}, "d": [1, 2],
               "e": {**good, "planned_s": float("nan")}}
    path.write_text(json.dumps({Calibration(**ident).key: {**old, "observed": damaged}}))
    assert observed_in(load_calibration(**ident, path=path)) == {"a": _seen(0.2)}
    path.write_text(json.dumps({Calibration(**ident).key: {**old, "observed": "not a map"}}))
    assert load_calibration(**ident, path=path).memory_bytes_per_s == 3e12  # the rates survive


def test_the_device_at_hand_is_found_by_uuid_whatever_the_torch_version(tmp_path):
    path = tmp_path / "calibration.json"
    key = _key(plan_for(GPT2, RUN, HW), "zero3")
    name = "NVIDIA H100 80GB HBM3"
    # torch's device properties give the uuid without NVML's "GPU-" prefix; two torch versions, the newer wins
    save_calibration(Calibration(device_name=name, device_uuid=H100_UUID[4:], torch_version="2.12.0",
                                 observed={key: _seen(0.3, at=1.0).as_dict()}), path=path)
    save_calibration(Calibration(device_name=name, device_uuid=H100_UUID, torch_version="2.13.0",
                                 observed={key: _seen(0.2, at=2.0).as_dict()}), path=path)
    save_calibration(Calibration(device_name=name, device_uuid="GPU-not-here", torch_version="2.13.0",
                                 observed={key: _seen(9.0, at=3.0).as_dict()}), path=path)
    inventory = load_inventory(INVENTORIES / "8xh100_nvswitch.json")
    assert observations_here(HW, inventory=inventory, path=path) == {key: _seen(0.2, at=2.0)}
    assert observations_for(uuids=(H100_UUID,), path=path)[key].measured_s == 0.2
    assert observations_here(parse_hardware("2xA100-80GB"), inventory=inventory, path=path) == {}
    assert observations_here(HW, inventory=load_inventory(INVENTORIES / "a100_mig.json"), path=path) == {}
    peak = parse_hardware("2xH100-80GB", peak_tflops=100)  # another board's figures: not what was measured
    assert observations_here(peak, inventory=inventory, path=path) == {}


def test_convoy_plan_on_the_gpu_at_hand_uses_what_was_measured_there(tmp_path, monkeypatch, capsys):
    """The second plan on a machine is better than the first: without --calibrate, and without torch."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CONVOY_INVENTORY", str(INVENTORIES / "8xh100_nvswitch.json"))
    argv = ["plan", str(CONFIGS / "gpt2.json"), "--hardware", "2xH100-80GB", "--seq-len", "1024",
            "--micro-batch", "8", "--json"]
    assert main(argv) == 0
    before = json.loads(capsys.readouterr().out)
    first = plan(CONFIGS / "gpt2.json", hardware="2xH100-80GB", seq_len=1024, micro_batch=8)
    key = _key(first, "zero3")
    save_calibration(Calibration(device_name="NVIDIA H100 80GB HBM3", device_uuid=H100_UUID, torch_version="2.13.0",
                                 observed={key: _seen(0.25).as_dict()}))
    assert main(argv) == 0
    after = json.loads(capsys.readouterr().out)
    seconds = {c["name"]: c["time"]["seconds"] for c in after["candidates"]}
    assert seconds["zero3"] == pytest.approx(0.25)
    assert {n: s for n, s in seconds.items() if n != "zero3"} == {
        c["name"]: c["time"]["seconds"] for c in before["candidates"] if c["name"] != "zero3"}
    assert "corrected by a measurement" in after["time_model"]["note"]
    assert main([*argv, "--efficiency", "0.5"]) == 0  # the flat datasheet model asked for: as it was
    assert "corrected" not in json.loads(capsys.readouterr().out)["time_model"]["note"]
    code = ("import sys\nfrom convoy.cli.main import main\n"
            f"assert main({argv!r}) == 0\nprint('torch' in sys.modules, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["time_model"]["observed"]["zero3"]["measured_s"] == 0.25
    assert out.stderr.strip() == "False"  # found without torch

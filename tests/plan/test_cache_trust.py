"""The calibration cache and the shipped device profiles cannot crash a plan nor steer it: a file that cannot be
read, an entry no measurement gives, or a cache another user can write is one warning naming it, and the plan goes
on without it. Another user is a second uid where the test runs as root (chown, or a forked process that drops to
``nobody``), else permissions and links of this user."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from convoy.errors import ConvoyWarning, PlanError
from convoy.plan.api import plan, plan_for
from convoy.plan.hardware import parse_hardware
from convoy.plan.model import from_hf_config
from convoy.plan.run import RunSpec
from convoy.plan.speed import profiles
from convoy.plan.speed.observed import Observation, case_key, observations_for
from convoy.plan.speed.records import Calibration, cached_records, load_calibration, save_calibration

CONFIGS = Path(__file__).parent / "configs"
INVENTORIES = Path(__file__).parents[1] / "inventories"
GPT2 = from_hf_config(CONFIGS / "gpt2.json")
RUN = RunSpec(seq_len=1024, micro_batch=8, precision="bf16")
HW = parse_hardware("2xH100-80GB")
H100 = dict(device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-47eaa099-2cb6-416d-86dc-283cf0480ff9",
            torch_version="2.13.0")  # the first device of tests/inventories/8xh100_nvswitch.json
PLAN = ["plan", str(CONFIGS / "gpt2.json"), "--hardware", "2xH100-80GB", "--seq-len", "1024", "--micro-batch", "8",
        "--json"]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a second user needs root (chown, setuid)")


def _seen(measured_s: float, **kw) -> dict:
    return {**Observation(measured_s=measured_s, planned_s=0.3, planned_bytes=10**9, measured_bytes=2 * 10**9,
                          rates="profile", steps=5, at=1.7e9).as_dict(), **kw}


def _zero3() -> str:
    return case_key(GPT2, RUN, plan_for(GPT2, RUN, HW).row("zero3").candidate.layout, HW)


def _write(path: Path, observed: dict, **rates) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = Calibration(**H100, **rates).as_dict()
    path.write_text(json.dumps({Calibration(**H100).key: {**record, "observed": observed}}))


def _convoy_plan(cache_home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home),
           "CONVOY_INVENTORY": str(INVENTORIES / "8xh100_nvswitch.json")}
    return subprocess.run([sys.executable, "-m", "convoy", *PLAN, *extra], capture_output=True, text=True, env=env,
                          timeout=120)


def _zero3_seconds(out: str) -> float:
    return {c["name"]: c["time"]["seconds"] for c in json.loads(out)["candidates"]}["zero3"]


@pytest.fixture(scope="module")
def modeled(tmp_path_factory) -> float:
    """zero3's step time with no cache at all."""
    done = _convoy_plan(tmp_path_factory.mktemp("empty"))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return _zero3_seconds(done.stdout)


@pytest.mark.parametrize("damage", ["utf8", "deep", "truncated", "array"])
def test_a_cache_that_cannot_be_read_is_one_warning_and_the_plan_goes_on(damage, tmp_path, modeled):
    """Invalid UTF-8 crashed every `convoy plan` with a 33-line UnicodeDecodeError traceback, 200,000 '[' with a
    RecursionError."""
    path = tmp_path / "convoy" / "calibration.json"
    path.parent.mkdir()
    path.write_bytes({"utf8": b'{"a": "\xff\xfe"}', "deep": b"[" * 200_000, "truncated": b'{"x": {"format": 1',
                      "array": b"[1, 2]"}[damage])
    done = _convoy_plan(tmp_path)
    assert done.returncode == 0 and _zero3_seconds(done.stdout) == modeled, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"convoy: warning: calibration cache {str(path)!r} "), lines
    assert {"utf8": "is not valid UTF-8 (byte 0xff at offset 7)", "deep": "is nested too deep to be read",
            "truncated": "is not JSON (", "array": "holds a JSON list, not an object"}[damage] in lines[0]
    assert lines[0].endswith("not read; remove it (it is measured again)") or "; remove it" in lines[0]


def test_a_damaged_shipped_profile_is_one_warning_and_the_others_stand(monkeypatch):
    """A truncated shipped H100 profile made every plan fail with a JSONDecodeError, A100 plans included."""
    good = dict(profiles._profile_files())
    monkeypatch.setattr(profiles, "_profile_files", lambda: [("h100-80gb.json", good["h100-80gb.json"][:200]),
                                                             ("other.json", good["h100-80gb.json"])])
    profiles.shipped_profiles.cache_clear()
    try:
        with pytest.warns(ConvoyWarning, match=r"device profile 'h100-80gb.json' \(shipped with convoy\) is not JSON"):
            kept = profiles.shipped_profiles()
        assert list(kept) == ["H100-80GB"]  # from the sound copy
        monkeypatch.setattr(profiles, "_profile_files", lambda: [("h100-80gb.json", b"\xff")])
        profiles.shipped_profiles.cache_clear()
        with pytest.warns(ConvoyWarning, match="is not valid UTF-8"):
            assert plan(CONFIGS / "gpt2.json", hardware="8xA100-80GB").recommendation.row is not None
        assert plan(CONFIGS / "gpt2.json", hardware="8xH100-80GB").time_model == "modeled"
    finally:
        profiles.shipped_profiles.cache_clear()


@pytest.mark.parametrize("value, says", [
    (1e-30, "measured_s = 1e-30 s is faster than any H100-80GB runs this case"),
    (1e30, "measured_s = 1e+30 s is longer than a day"),
    (3600.0, "measured_s = 3.6e+03 s is "),  # an hour for GPT-2 (planned 0.066 s) flipped the recommendation
])
def test_an_observation_no_gpu_could_make_is_refused_naming_the_file_and_the_case(value, says, tmp_path, modeled):
    """measured_s 1e-30 made `convoy plan` recommend a layout at '0 us per step, 2,047,999,...,744 tokens/s per
    GPU'; 1e30 flipped a recommendation."""
    path = tmp_path / "convoy" / "calibration.json"
    _write(path, {_zero3(): _seen(value)})
    done = _convoy_plan(tmp_path)
    assert done.returncode == 0 and _zero3_seconds(done.stdout) == modeled, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"convoy: warning: calibration cache {str(path)!r}, entry {Calibration(**H100).key!r}, "
                               f"case {_zero3()!r}: {says}"), lines
    assert lines[0].endswith("ignored, the plan keeps its modeled time")
    if value == 3600.0:
        assert "outside the 0.1x-10x band an observation is used in" in lines[0]
    _write(path, {_zero3(): _seen(0.25)})  # a measurement a GPU can make is taken, as before
    assert _zero3_seconds(_convoy_plan(tmp_path).stdout) == pytest.approx(0.25)


def test_observations_that_are_not_numbers_are_each_one_warning(tmp_path):
    """0, -1, NaN, strings and wrong shapes were dropped without a word."""
    path = tmp_path / "calibration.json"
    bad = {"zero": _seen(0), "negative": _seen(-1.0), "nan": _seen(float("nan")), "string": _seen("fast"),
           "list": [1, 2], "bytes": _seen(0.3, measured_bytes="2 GB"), "future": _seen(0.3, at=1e300),
           "rates": _seen(0.3, rates=["profile"])}
    _write(path, {"good": _seen(0.3), **bad})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = observations_for(uuids=(H100["device_uuid"],), path=path)
    assert list(found) == ["good"]
    said = sorted(str(w.message) for w in caught if w.category is ConvoyWarning)
    assert len(said) == len(bad), said
    assert all(line.startswith(f"calibration cache {str(path)!r}, entry ") or "observed['list']" in line
               for line in said), said
    assert any("case 'nan': measured_s = nan is not a finite number > 0: ignored" in line for line in said), said
    assert any("case 'bytes': measured_bytes = '2 GB' is not a finite number > 0" in line for line in said), said
    assert any("case 'future': at = 1e+300 is a date in the future: ignored" in line for line in said), said


@pytest.mark.parametrize("field, value", [("device_name", 7), ("device_uuid", ["GPU-x"]), ("torch_version", None),
                                          ("measured_at", 1e300)])
def test_an_entry_whose_fields_have_the_wrong_type_is_one_warning_and_the_plan_goes_on(field, value, tmp_path,
                                                                                       modeled):
    """A device_name or device_uuid that was not a string gave a 38-line AttributeError on every `convoy plan`."""
    path = tmp_path / "convoy" / "calibration.json"
    _write(path, {_zero3(): _seen(0.25)})
    data = json.loads(path.read_text())
    data[Calibration(**H100).key][field] = value
    path.write_text(json.dumps(data))
    done = _convoy_plan(tmp_path)
    assert done.returncode == 0 and _zero3_seconds(done.stdout) == modeled, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"convoy: warning: calibration cache {str(path)!r}"), lines
    assert f"{field} = " in lines[0] and lines[0].endswith(": ignored"), lines


@pytest.mark.parametrize("field, value, says", [
    ("gemm_flops", {"8192x768x2304:bf16": 5e15}, "is above the H100-80GB's peak (989.4 TFLOP/s)"),
    ("memory_bytes_per_s", 4e13, "is above the H100-80GB's memory bandwidth"),
    ("launch_seconds", 1e-12, "is below the kernel-launch floor"),
    ("peer_bytes_per_s", 5e12, "is above the H100-80GB's fastest link"),
    ("attention_seconds", {"8x12x12x1024x64:bf16": 1e-9}, "is faster than its FLOPs at the H100-80GB's peak"),
])
def test_rates_beyond_the_board_are_refused_naming_the_file_and_the_key(field, value, says, tmp_path):
    path = tmp_path / "calibration.json"
    save_calibration(Calibration(**H100, memory_bytes_per_s=3e12, launch_seconds=5e-6, measured_at=1.7e9),
                     path=path)
    data = json.loads(path.read_text())
    data[Calibration(**H100).key][field] = value
    path.write_text(json.dumps(data))
    with pytest.warns(ConvoyWarning) as caught:
        assert load_calibration(**H100, path=path) is None and cached_records(path=path) == []
    message = str(caught[0].message)
    assert message.startswith(f"calibration cache {str(path)!r}, entry {Calibration(**H100).key!r}: {field}")
    assert says in message and message.endswith(": ignored"), message


# --- who may write the cache ------------------------------------------------------------------------------------

def _planted(directory: Path) -> Path:
    """A cache in ``directory`` whose observation would make zero3 take 1 ms."""
    path = directory / "calibration.json"
    _write(path, {_zero3(): _seen(0.001)})
    return path


@pytest.mark.parametrize("loose", ["directory", "file"])
def test_a_cache_others_can_write_is_not_read_nor_written(loose, tmp_path, modeled):
    cache = tmp_path / "convoy"
    path = _planted(cache)
    (cache if loose == "directory" else path).chmod(0o777 if loose == "directory" else 0o666)
    done = _convoy_plan(tmp_path)
    assert done.returncode == 0 and _zero3_seconds(done.stdout) == modeled, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"convoy: warning: calibration cache {str(path)!r}: the {loose} "), lines
    assert "is writable by other users (mode 0" in lines[0] and "so another user could steer your plans: not read" \
        in lines[0], lines
    if loose == "directory":
        with pytest.raises(PlanError, match=r"not writing the calibration cache .* is writable by other users"):
            save_calibration(Calibration(**H100), path=path)


def test_a_link_to_another_users_directory_is_refused(tmp_path, modeled):
    """~/.cache/convoy a link to a directory another user owns (and can write): their observations steered the
    victim's plans, and the victim's jobs wrote their cache there."""
    theirs = tmp_path / "theirs"
    path = _planted(theirs)
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody").pw_uid
        for p in (theirs, path):
            os.chown(p, nobody, nobody)
    theirs.chmod(0o777)
    home = tmp_path / "home"
    home.mkdir()
    (home / "convoy").symlink_to(theirs)
    done = _convoy_plan(home)
    assert done.returncode == 0 and _zero3_seconds(done.stdout) == modeled, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "so another user could steer your plans" in done.stderr, done.stderr
    assert f"the directory {str(theirs)!r} (where {str(home / 'convoy')!r} leads) " in done.stderr, done.stderr
    with pytest.raises(PlanError, match="not writing the calibration cache"):
        save_calibration(Calibration(**H100), path=home / "convoy" / "calibration.json")
    assert json.loads(path.read_text()) != {}  # theirs, untouched


@root_only
def test_another_user_planting_in_a_shared_cache_home_steers_nothing(tmp_path, modeled):
    """XDG_CACHE_HOME a shared 1777 directory where another user (a second uid: nobody) made convoy/ first and
    planted an observation."""
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="convoy-shared-cache-", dir="/tmp"))  # a place nobody can reach
    try:
        shared.chmod(0o1777)
        key = _zero3()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the other user
            code = 1
            try:
                os.setgid(pwd.getpwnam("nobody").pw_gid)
                os.setuid(pwd.getpwnam("nobody").pw_uid)
                os.mkdir(shared / "convoy", 0o777)
                os.chmod(shared / "convoy", 0o777)
                record = Calibration(**H100).as_dict()
                (shared / "convoy" / "calibration.json").write_text(
                    json.dumps({Calibration(**H100).key: {**record, "observed": {key: _seen(0.001)}}}))
                code = 0
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        planted = shared / "convoy" / "calibration.json"
        assert planted.stat().st_uid == pwd.getpwnam("nobody").pw_uid
        done = _convoy_plan(shared)
        assert done.returncode == 0 and _zero3_seconds(done.stdout) == modeled, done.stderr
        assert done.stderr.startswith(f"convoy: warning: calibration cache {str(planted)!r}: the directory ") and \
            "belongs to nobody" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
        with pytest.raises(PlanError, match="belongs to nobody"):
            save_calibration(Calibration(**H100), path=planted)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_cache_of_ones_own_in_a_shared_cache_home_is_made_private_and_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    path = shared / "convoy" / "calibration.json"
    save_calibration(Calibration(**H100, observed={_zero3(): _seen(0.25)}), path=path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _zero3_seconds(_convoy_plan(shared).stdout) == pytest.approx(0.25)

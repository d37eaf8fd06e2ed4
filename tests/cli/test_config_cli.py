"""``convoy config``: writing with flags or questions, ``show`` with sources, ``keys``, and every bad argument."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from convoy.cli.config import ask
from convoy.cli.main import main
from convoy.config import read_settings_file


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A private XDG config dir and working directory; returns the user file's path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CONVOY_CONFIG", raising=False)
    for name in ("STRATEGY", "MIXED_PRECISION", "MAX_RESTARTS", "DEVICES"):
        monkeypatch.delenv(f"CONVOY_{name}", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "xdg" / "convoy" / "config.toml"


def _values(path):
    return {k: v.value for k, v in read_settings_file(path).items()}


def test_flags_write_the_user_file_and_show_reports_sources(isolated, capsys, monkeypatch):
    assert main(["config", "--strategy", "ddp", "--mixed-precision", "bf16", "--max-restarts", "2"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {isolated}"
    assert _values(isolated) == {"strategy": "ddp", "mixed_precision": "bf16", "max_restarts": 2}
    assert main(["config", "--max-restarts", ""]) == 0  # '' removes the key
    assert "max_restarts" not in _values(isolated)

    monkeypatch.setenv("CONVOY_MIXED_PRECISION", "fp16")
    capsys.readouterr()
    assert main(["config", "show", "--json", "--strategy", "fsdp"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["files"] == [str(isolated)]
    assert shown["settings"]["strategy"] == {"value": "fsdp", "source": "flag --strategy",
                                             "doc": shown["settings"]["strategy"]["doc"]}
    assert shown["settings"]["mixed_precision"]["source"] == "environment CONVOY_MIXED_PRECISION"
    assert main(["config", "show"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["strategy"].endswith(f"user file {isolated}:5") and '"ddp"' in lines["strategy"]
    assert lines["devices"].endswith("default")


def test_path_writes_a_project_file(isolated, capsys):
    assert main(["config", "--path", "convoy.toml", "--devices", "1,0", "--free", "yes"]) == 0
    assert _values("convoy.toml") == {"devices": "1,0", "free": True}
    assert not isolated.exists()
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"source": "project file' in out


def test_questions_write_the_answers(isolated, capsys, monkeypatch):
    answers = iter(["0,1", "", "zero2", "bf61", "bf16", "", "2", "node0:29500", "1"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    assert main(["config", "--interactive"]) == 0
    out = capsys.readouterr().out
    assert "expected one of no, fp16, bf16, fp8 (did you mean 'bf16'?)" in out
    assert _values(isolated) == {"devices": "0,1", "free": False, "strategy": "zero2", "mixed_precision": "bf16",
                                 "gradient_accumulation_steps": 1, "nnodes": "2", "rdzv_endpoint": "node0:29500",
                                 "max_restarts": 1}


def test_questions_show_current_values_and_stop_at_end_of_input():
    prompts = []

    def read(prompt):
        prompts.append(prompt)
        if len(prompts) > 2:
            raise EOFError
        return ""

    got = ask({"devices": "2"}, read=read, out=io.StringIO())
    assert got == {"devices": "2", "free": False}
    assert prompts[0].endswith("devices [2]: ") and prompts[1].endswith("free [false]: ")


def test_questions_give_up_after_three_wrong_answers():
    with pytest.raises(Exception, match="nnodes|devices"):
        ask({}, read=lambda prompt: "not a device", out=io.StringIO())


def test_keys_lists_every_key(capsys):
    assert main(["config", "keys", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"key": "strategy", "flag": "--strategy", "env": "CONVOY_STRATEGY"}.items() <= rows[2].items()
    assert main(["config", "keys"]) == 0
    assert "CONVOY_COLLECTIVE_TIMEOUT" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["config", "--strategy", "d d p"], "convoy: setting 'strategy': 'd d p' is not valid"),
    (["config", "--max-restarts", "many"], "expected a whole number >= 0"),
    (["config", "--json"], "--json goes with 'convoy config show'"),
    (["config"], "nothing to write: give settings as flags"),
    (["config", "show", "--gradient-accumulation-steps", "0"], "flag --gradient-accumulation-steps: '0'"),
])
def test_bad_arguments_are_one_line_exit_2(isolated, capsys, monkeypatch, argv, message):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_malformed_file_stops_show_with_file_line_and_key(isolated, capsys):
    isolated.parent.mkdir(parents=True)
    isolated.write_text('strategy = "ddp"\nmixed_precison = "bf16"\n')
    assert main(["config", "show"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"convoy: {isolated}, line 2, key 'mixed_precison': unknown key (did you mean 'mixed_precision'?)")


def test_show_warns_of_a_strategy_launch_would_refuse_and_shows_the_rest(isolated, capsys):
    """strategy = "bogus" was shown without a word; convoy launch refused it later. show goes on (exit 0, every value
    in view) with one warning naming the file and line."""
    isolated.parent.mkdir(parents=True)
    isolated.write_text('mixed_precision = "bf16"\nstrategy = "bogus"\n')
    assert main(["config", "show"]) == 0
    out, err = capsys.readouterr()
    assert '"bogus"' in out and '"bf16"' in out
    assert err.strip().splitlines() == [f"convoy: warning: strategy = 'bogus' ({isolated}, line 2) is not one of "
                                        f"convoy's strategies (auto, single, dp, ddp, zero1, zero2, zero3, fsdp, hsdp, "
                                        f"parallel, tp, pp): convoy launch refuses it (a strategy your script "
                                        f"registers itself is chosen in the script, Accelerator(strategy=...))"]
    isolated.write_text('strategy = "zero3"\n')
    assert main(["config", "show"]) == 0 and capsys.readouterr().err == ""


def test_unknown_action_and_flag_exit_2(tmp_path):
    for argv in (["config", "shw"], ["config", "--stratgy", "ddp"]):
        proc = subprocess.run([sys.executable, "-m", "convoy", *argv], capture_output=True, text=True,
                              env={"PATH": "", "HOME": str(tmp_path)})
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_help_has_examples():
    proc = subprocess.run([sys.executable, "-m", "convoy", "config", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "examples:" in proc.stdout and "convoy config show" in proc.stdout


def test_config_show_and_env_without_torch_stay_torch_free(tmp_path):
    code = ("import sys; from convoy.cli.main import main; main(['config', 'show']); main(['env', '--no-torch']); "
            "sys.exit(3 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "", "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)})
    assert proc.returncode == 0, proc.stderr

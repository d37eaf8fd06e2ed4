"""``convoy plan``: table, JSON, plot, errors as one line with exit 2, and no torch for --help or configs."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from convoy.cli.main import main
from convoy.plan.model import from_factory

CONFIGS = Path(__file__).parent / "configs"


def test_help_and_a_config_plan_do_not_import_torch():
    code = ("import sys, io, contextlib\n"
            "from convoy.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main(['plan', '--help'])\n"
            "    except SystemExit: pass\n"
            f"    rc = main(['plan', {str(CONFIGS / 'llama2_7b.json')!r}, '--hardware', '8xH100-80GB'])\n"
            "assert rc == 0, rc\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_table_names_every_candidate_and_the_recommendation(capsys):
    assert main(["plan", str(CONFIGS / "llama2_7b.json"), "--hardware", "8xH100-80GB", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    for word in ("candidate", "zero1", "zero3", "tp8", "pp8", "recommended:", "case 2", "what would change it"):
        assert word in out
    assert "6,738,415,616 parameters" in out


def test_json_output_is_the_plan(capsys):
    assert main(["plan", "--params", "7.5e9", "--hardware", "8xA100-80GB", "--nodes", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    states = {c["name"]: c["model_states_bytes"] for c in data["candidates"]}
    for c in data["candidates"]:  # one number: parameters + gradients + optimizer + master weights
        assert c["model_states_bytes"] == sum(c["memory"][k] for k in ("params", "grads", "optimizer", "master"))
    # the ZeRO paper's figure 1 (Psi = 7.5B, Nd = 64, K = 12): 120 / 31.4 / 16.6 / 1.9 GB
    assert [round(states[n] / 1e9, 1) for n in ("ddp", "zero1", "zero2", "zero3")] == [120.0, 31.4, 16.6, 1.9]
    assert data["hardware"]["gpus_per_node"] == 8 and data["hardware"]["nodes"] == 8
    rec = data["recommendation"]
    # the command that runs the choice, in convoy launch's words, for the recommendation and every row
    assert rec["candidate"] and rec["launch_args"][:4] == ["--nnodes", "8", "--nproc-per-node", "8"]
    assert rec["launch_args"][4:6] == ["--strategy", rec["strategy"]] and rec["command"].startswith("convoy launch ")
    assert rec["accelerator"].startswith(f'Accelerator(strategy="{rec["strategy"]}"')
    assert all(c["launch_args"][5] == c["strategy"] for c in data["candidates"])


def test_hardware_flags_reach_the_plan(capsys):
    argv = ["plan", "--params", "13e9", "--layers", "40", "--hidden", "5120", "--heads", "40", "--vocab", "32000",
            "--hardware", "8xH100-80GB", "--nodes", "2", "--intra", "pcie", "--inter-gbps", "400", "--json",
            "--recompute", "full", "--precision", "bf16-fp32-grads", "--strategies", "ddp,zero1,zero3,hsdp"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"]["nodes"] == 2 and data["hardware"]["intra"] == "pcie"
    assert data["run"]["recompute"] == "full" and data["recommendation"]["case"] == "multi-node slow"
    assert {c["strategy"] for c in data["candidates"]} <= {"ddp", "zero1", "zero3", "hsdp"}


@pytest.mark.parametrize("argv,word", [
    (["plan"], "no model given"),
    (["plan", "--params", "1e9", "--hardware", "8xB999"], "unknown accelerator 'B999'"),
    # the CPU plan a run's step line compares with is counted from the run: said where, not "unknown accelerator"
    (["plan", "--params", "1e9", "--hardware", "2xCPU"], "a run on CPU prints its own plan in its step line"),
    (["plan", str(CONFIGS / "nope.json"), "--hardware", "8xH100-80GB"], "does not exist"),
    (["plan", "--params", "1e9", "--hardware", "8xH100-80GB", "--strategies", "ddp,magic"], "unknown 'magic'"),
    (["plan", "--params", "1e9", "--hardware", "8xH100-80GB", "--efficiency", "45"], "fraction of peak"),
    (["plan", "--params", "1e9", "--hardware", "4xL4", "--intra", "nvlink"], "no NVLink"),
    (["plan", "--params", "1e9", "--hardware", "8xH100-80GB", "--precision", "bf15"], "invalid choice"),
    (["plan", "--params", "-3"], "must be > 0"),
    (["plan", "--params", "1e9", "--hardware", "8xH100-80GB", "--seq-len", "0"], "must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, word):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert word in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_accelerator_here_asks_for_hardware(capsys, tmp_path, monkeypatch):
    empty = tmp_path / "empty.json"
    empty.write_text('{"devices": []}')
    monkeypatch.setenv("CONVOY_INVENTORY", str(empty))
    assert main(["plan", "--params", "1e9"]) == 2
    assert "--hardware" in capsys.readouterr().err
    # said before the model is built (a factory can take seconds): this one would leave a file behind
    built = tmp_path / "built"
    (tmp_path / "slow_model.py").write_text(f"def build():\n    open({str(built)!r}, 'w').close()\n"
                                            f"    raise SystemExit('built')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plan", "slow_model:build"]) == 2
    assert "no accelerator detected" in capsys.readouterr().err and not built.exists()


def test_inventory_flag(capsys, inventory_path):
    assert main(["plan", "--params", "1e9", "--inventory", str(inventory_path("8xh100_nvswitch")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"]["gpus_per_node"] == 8


def test_plot(capsys, tmp_path):
    out = tmp_path / "plan.png"
    rc = main(["plan", "--params", "7e9", "--layers", "32", "--hidden", "4096", "--heads", "32",
               "--hardware", "8xH100-80GB", "--plot", str(out)])
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "needs matplotlib" in capsys.readouterr().err and not out.exists()
    else:
        assert rc == 0 and out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_without_a_suffix_writes_png_and_says_where(capsys, tmp_path):
    rc = main(["plan", "--params", "7e9", "--hardware", "8xH100-80GB", "--plot", str(tmp_path / "plan")])
    assert rc == 0 and (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "plan").exists()
    assert f"written to {tmp_path / 'plan.png'}\n" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
@pytest.mark.parametrize("where, says", [("/proc/x.png", "--plot /proc/x.png: cannot write there"),
                                         ("{d}/x.xyz", "matplotlib does not write '.xyz' files; end the name in one "
                                                       "of .avif, .eps"),
                                         ("{d}/no/such/dir/x.png", "cannot write there (No such file or directory)"),
                                         ("{d}", "is a directory")])
def test_a_plot_path_that_cannot_be_written_is_refused_before_planning(where, says, capsys, tmp_path, monkeypatch):
    """Both were tracebacks after the whole plan had run."""
    import convoy.plan.api

    monkeypatch.setattr(convoy.plan.api, "plan", lambda *a, **k: pytest.fail("planned before the path was checked"))
    target = where.format(d=tmp_path / "plan.png") if where == "{d}" else where.format(d=tmp_path)
    if where == "{d}":
        (tmp_path / "plan.png").mkdir()
    assert main(["plan", "--params", "7e9", "--hardware", "8xH100-80GB", "--plot", target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("convoy: ") and says in err[0], err
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "plan.png"])  # nothing left behind


def test_the_documented_case_3_table_is_what_convoy_plan_prints(capsys):
    """docs/choosing-a-strategy.md shows rows of `convoy plan` for a 70B Llama on 4 nodes of 8 H100s: each row shown
    is the command's own, whole, so the guide stays true when the model changes."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "choosing-a-strategy.md").read_text()
    block = text[text.index("$ convoy plan llama70b.json"):].split("```")[0].splitlines()
    assert main(["plan", str(CONFIGS / "llama2_70b.json"), "--hardware", "8xH100-80GB", "--nodes", "4",
                 "--inter-gbps", "3200", "--recompute", "full"]) == 0
    printed = {line.split()[0]: line.rstrip() for line in capsys.readouterr().out.splitlines() if line.strip()}
    rows = [line for line in block[1:] if re.match(r"(single|ddp|zero|hsdp|tp|pp)", line)]  # the candidates' rows
    assert len(rows) >= 5, block
    for shown in rows:  # whole rows, as printed (python -m tests.test_readme --regenerate rewrites them)
        assert shown.rstrip() == printed[shown.split()[0]], (shown, printed[shown.split()[0]])


def _console_script() -> str:
    """The ``convoy`` console script of the Python running the tests (not ``python -m convoy``, which puts the
    working directory on ``sys.path`` by itself)."""
    found = shutil.which("convoy", path=sysconfig.get_path("scripts")) or shutil.which("convoy")
    assert found, f"the convoy console script is not installed beside {sys.executable}"
    return found


def test_a_factory_in_the_working_directory_plans_through_the_console_script(tmp_path):
    """docs/planner.md's `convoy plan mypkg.models:build`, run from the folder holding `mypkg/`, said "cannot
    import 'mypkg.models'": the console script does not put the working directory on sys.path. A path to a file
    imports the file's neighbours, as `python path/to/file.py` would."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "blocks.py").write_text("import torch\nWIDTH = 32\nBlock = torch.nn.Linear\n")
    (tmp_path / "mypkg" / "models.py").write_text(
        "import torch\nfrom mypkg.blocks import WIDTH, Block\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(100, WIDTH), *[Block(WIDTH, WIDTH) for _ in range(4)])\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shapes.py").write_text("WIDTH = 16\n")
    (tmp_path / "other" / "net.py").write_text(
        "import torch\nfrom shapes import WIDTH\ndef build():\n    return torch.nn.Linear(WIDTH, WIDTH)\n")
    params = {"mypkg.models:build": 100 * 32 + 4 * (32 * 32 + 32), "other/net.py:build": 16 * 16 + 16}
    for target, count in params.items():
        out = subprocess.run([_console_script(), "plan", target, "--hardware", "8xH100-80GB", "--json"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["model"]["params"] == count
    out = subprocess.run([_console_script(), "plan", "mypkg.models:build", "--hardware", "8xH100-80GB"],
                         cwd=tmp_path / "other", capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().endswith("(ModuleNotFoundError: No module named 'mypkg')")


def test_a_factory_leaves_sys_path_as_it_found_it(tmp_path, monkeypatch):
    (tmp_path / "cwd_factory.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    try:
        assert from_factory("cwd_factory:build").num_params == 20
    finally:
        sys.modules.pop("cwd_factory", None)
    assert sys.path == before


def test_the_newcomers_planner_lines(capsys):
    """--strategies tp alone said 'no candidate layout is allowed (tp)' without saying why; '1 of 2 layouts do not
    fit'; the derived shape said 'hidden = 128 x layers' beside 33 layers of 4096."""
    assert main(["plan", str(CONFIGS / "llama2_7b.json"), "--hardware", "8xH100-80GB", "--strategies", "offload"]) == 2
    assert "tp, pp and offload go beside a data-parallel strategy; list one with them, e.g. --strategies " \
        "zero3,offload" in capsys.readouterr().err
    # tp alone is a layout of its own (strategy parallel, dp = 1), which the trainer runs
    assert main(["plan", str(CONFIGS / "llama2_7b.json"), "--hardware", "8xH100-80GB", "--strategies", "tp"]) == 0
    assert "recommended: tp8  (strategy=parallel, dp=1,tp=8,pp=1)" in capsys.readouterr().out
    assert main(["plan", "--params", "7e9", "--hardware", "1xH100-80GB"]) == 0
    out = capsys.readouterr().out
    assert "No layout fits as asked: the smallest, single, needs 1" in out and "hidden = 128 x layers)" not in out
    assert "hidden the size nearest 128 x layers, then as many layers as the count takes" in out
    assert "--calibrate measures this machine" not in out
    assert main(["plan", "--params", "3e9", "--hardware", "2xA100-40GB"]) == 0  # ddp does not fit, the ZeRO ones do
    out = capsys.readouterr().out
    assert re.search(r"- 1 of \d+ layouts does not fit in memory\.", out) and "layouts do not fit" not in out, out


def test_launch_orders_are_the_ones_select_takes(capsys):
    from convoy.devices.selection import ORDERS

    try:
        main(["launch", "--help"])
    except SystemExit:
        pass
    assert f"device order for a count: {', '.join(ORDERS)}" in " ".join(capsys.readouterr().out.split())


def test_the_plots_bars_add_up_to_each_layouts_total_and_what_fits_comes_first():
    """--plot stacked every part, so the bars rose above the peak they were drawn against (gradients and
    activations do not all coincide); now three parts add up to the plan's total."""
    from convoy.plan.api import plan
    from convoy.plan.plot import _ordered, segments
    from convoy.plan.units import GiB

    p = plan(CONFIGS / "llama2_7b.json", hardware="8xH100-80GB")
    for row in p.rows:
        assert sum(segments(row.memory)) * GiB == pytest.approx(row.memory.total, rel=1e-9)
        assert min(segments(row.memory)) >= 0
    ordered = _ordered(p.rows)
    fits = [r.fits for r in ordered]
    assert fits == sorted(fits, reverse=True)  # every fitting layout before every other
    fitting = [r.time.seconds for r in ordered if r.fits]
    assert fitting == sorted(fitting)


def test_a_sequence_longer_than_the_model_takes_is_said(capsys):
    gpt2 = str(Path(__file__).parent / "configs" / "gpt2.json")
    assert main(["plan", gpt2, "--hardware", "1xH100-80GB"]) == 0  # the default seq 2048
    out = capsys.readouterr().out
    assert "note      seq 2048 is longer than the 1,024 positions this model takes" in out, out
    assert "--seq-len 1024" in out
    assert main(["plan", gpt2, "--hardware", "1xH100-80GB", "--seq-len", "1024", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["model"]["max_positions"] == 1024 and "longer than" not in json.dumps(said)
    tiny = str(Path(__file__).parents[2] / "examples" / "tiny_gpt.py")
    assert main(["plan", f"{tiny}:TinyGPT", "--hardware", "2xH100-80GB", "--seq-len", "64"]) == 0
    assert "longer than the 32 positions" in capsys.readouterr().out  # a module's position embedding


def test_the_table_marks_the_recommended_row_and_stays_narrow(capsys):
    assert main(["plan", "--params", "7e9", "--hardware", "8xH100-80GB"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[1].splitlines()
    assert max(len(line) for line in table) <= 120, table
    chosen = re.search(r"recommended: (\S+)", out).group(1)
    marked = [line for line in table if line.endswith("<- recommended")]
    assert [line.split()[0] for line in marked] == [chosen], table
    assert "7B params: 7,000,000,000 parameters" in out and "e+" not in out.split("\n")[0]

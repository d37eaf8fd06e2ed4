"""The README's commands, run as a newcomer copies them: every line of its ``bash`` blocks is run here or listed
with the reason it is not (a new line fails ``test_every_readme_command_is_run_or_skipped_with_a_reason`` until
it is one or the other). The same for the ``$ command`` lines of docs/*.md that show their output: what they
print must hold what the page shows (``...`` marks what a page leaves out).

    python -m pytest -q tests/test_readme.py

Each runs in ``bash -c``, exactly as written, from an empty directory holding what the README's placeholders
name: ``train.py`` (a stand-in that prints its devices and arguments), ``path/to/config.json`` (Llama-2-7B's
config from ``tests/plan/configs``), ``examples/`` (the repository's), ``fsdp.yaml`` (Accelerate's FSDP template,
``tests/config/accelerate/fsdp_template.yaml``), with ``convoy`` and ``python`` on
``PATH`` (the console script and interpreter of this Python). The GPU box of the tour is
``tests/inventories/8xh100_nvswitch.json``, replayed with ``CONVOY_INVENTORY`` until the tour writes ``box.json``,
then that snapshot, as the README says; commands that start ranks of a job run them as CPU processes
(``CUDA_VISIBLE_DEVICES=""``), so a GPU machine gives the same result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path

import pytest

from tests import processes

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
INVENTORY = REPO / "tests" / "inventories" / "8xh100_nvswitch.json"
CONFIG = REPO / "tests" / "plan" / "configs" / "llama2_7b.json"

TRAIN_PY = """import os, sys
print("TRAIN", "devices=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), "rank=" + os.environ.get("RANK", "-"),
      "args=" + " ".join(sys.argv[1:]))
"""


@dataclass(frozen=True)
class Run:
    """How a README command is run and what its output must hold."""

    expect: tuple[str, ...]
    """Substrings of stdout + stderr (a ``re`` pattern when it starts with ``re:``)."""
    then: str = ""
    """Appended to the command: an argument that shortens it, or a check of what it did (the reason beside it)."""
    dry_run: bool = False
    """``convoy launch --dry-run ...``: the plan, where the job cannot run here (the reason beside it)."""
    cpu: bool = False
    """Starts a job's ranks: as CPU processes, no inventory."""
    launches: bool = False
    """Starts processes: the slow test runs it, the quick one does not."""


#: every command of the README's ``bash`` blocks, exactly as written there (comments removed)
TOUR: dict[str, Run | str] = {
    # Set-up
    "make demo": "builds .venv and installs torch (about a minute); CI's .ci/run runs make test, which builds it too",
    "make test": "the test suite itself",
    # A short tour
    "convoy devices": Run(("re:(\\d +NVIDIA H100 80GB HBM3 .*\\n){8}source: file:",)),
    # then: the snapshot holds the 8 devices (every later command replays it)
    "convoy devices --json > box.json": Run(("SNAPSHOT 8",), then=(
        " && python -c \"import json; print('SNAPSHOT', len(json.load(open('box.json'))['devices']))\"")),
    "convoy select 2 --free --format env": Run(("export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1",)),
    # then: what the shell now exports
    'eval "$(convoy select 2 --free --format env)"': Run(("VISIBLE 0,1",),
                                                         then=' && echo "VISIBLE $CUDA_VISIBLE_DEVICES"'),
    "convoy run --devices 1,3 -- python train.py": Run(("TRAIN devices=1,3 rank=- args=",), launches=True),
    "convoy launch --devices 0,2 train.py --lr 1e-3": Run(
        ("[rank0]: TRAIN devices=0,2 rank=0 args=--lr 1e-3", "[rank1]: TRAIN devices=0,2 rank=1 args=--lr 1e-3"),
        launches=True),
    # the second machine does not exist here: the plan of node 0 is shown instead
    "convoy launch --nnodes 2 --node-rank 0 --rdzv-endpoint host:29400 train.py": Run(
        ("nodes:      2 (this is node 0); 8 processes per node; world size 16", "MASTER_ADDR=host"), dry_run=True),
    # 8 CPU processes; 2 training steps instead of 30 keep it to about 20 s on 2 cores
    "convoy launch --nproc-per-node 8 --dp 2 --tp 2 --pp 2 examples/tiny_gpt_pp.py": Run(
        ("layout zero2+tp2+pp2 (dp=2,tp=2,pp=2)", "re:step +1 +loss"), then=" --steps 2", cpu=True, launches=True),
    "convoy plan path/to/config.json --hardware 8xH100-80GB": Run(
        ("6,738,415,616 parameters", "hardware  8xH100-80GB (nvlink)", "recommended:",
         "re:run it:  convoy launch --nnodes 1 --nproc-per-node 8 --strategy \\w+", "or:      Accelerator(strategy=")),
    # measures the GPU where there is one; here it says why it did not
    "convoy plan path/to/config.json --calibrate": Run(
        ("re:time: (rates measured on this machine|calibration failed \\(calibration needs a CUDA device)",)),
    "convoy env": Run(("convoy:", "torch:", "box.json")),
    "convoy test": Run(("result: all checks passed",), cpu=True, launches=True),
    "convoy config show": Run(("re:strategy +\"auto\" +default",)),
    # Tests and benchmarks
    ".venv/bin/python benchmarks/cli_latency.py": "a benchmark (about a minute of timed runs), not a check",
    ".venv/bin/python benchmarks/launch_overhead.py": "a benchmark (minutes of timed launches), not a check",
    ".venv/bin/python benchmarks/step_overhead.py": "a benchmark (minutes of timed training steps), not a check",
    "python3 benchmarks/planner_accuracy.py": "needs a GPU (docs/gpu.md, docs/planner-accuracy.md section 7)",
}

#: "From the launchers you know": each convoy line, with --dry-run, on the inventory's 8 GPUs
LAUNCHER_TABLE = {
    "convoy launch --nproc-per-node 2 train.py": ("rank 1 (local 1): device 1",),
    "convoy launch --num_processes 2 train.py": ("rank 1 (local 1): device 1",),
    "convoy launch --devices 2 train.py": ("rank 1 (local 1): device 1",),
    "convoy launch --devices 2,0 train.py": ("rank 0 (local 0): device 2", "as cuda:0", "rank 1 (local 1): device 0"),
    "convoy launch --config_file fsdp.yaml train.py": (
        "strategy = zero3 (fsdp.yaml: fsdp_config.fsdp_sharding_strategy = FULL_SHARD)", "rank 1 (local 1): device 1"),
}


def _code_blocks(text: str, languages: tuple[str, ...]) -> list[list[str]]:
    """The lines of each fenced code block of ``text`` whose language is one of ``languages`` ("" for none)."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = [] if line[3:].strip() in languages else False
            else:
                if current is not False:
                    blocks.append(current)
                current = None
        elif isinstance(current, list):
            current.append(line)
    return blocks


def readme_commands() -> list[str]:
    """Every command line of the README's ``bash`` blocks, in order, without its comment."""
    commands = []
    for block in _code_blocks(README.read_text(), ("bash",)):
        for line in block:
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_every_readme_command_is_run_or_skipped_with_a_reason():
    commands = readme_commands()
    assert "convoy devices" in commands and len(commands) > 10, commands
    assert [c for c in commands if c not in TOUR] == [], "README commands this test neither runs nor skips"
    assert [c for c in TOUR if c not in commands] == [], "commands listed here that the README no longer has"
    table = re.findall(r"^\| `[^`]+` \| `(convoy launch [^`]+ train\.py)`", README.read_text(), flags=re.M)
    assert set(LAUNCHER_TABLE) <= set(table), table


def _console_dir(tmp_path: Path) -> Path:
    """A folder with ``convoy`` (this Python's console script) and ``python`` (this interpreter)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    found = shutil.which("convoy", path=sysconfig.get_path("scripts")) or shutil.which("convoy")
    assert found, f"the convoy console script is not installed beside {sys.executable}"
    (bin_dir / "convoy").symlink_to(found)
    (bin_dir / "python").symlink_to(sys.executable)
    return bin_dir


def _newcomer_dir(tmp_path: Path) -> tuple[Path, Path]:
    """The newcomer's directory: the README's placeholders, and its commands' PATH."""
    work = tmp_path / "work"
    (work / "path" / "to").mkdir(parents=True)
    shutil.copy(CONFIG, work / "path" / "to" / "config.json")
    (work / "train.py").write_text(TRAIN_PY)
    shutil.copy(REPO / "tests" / "config" / "accelerate" / "fsdp_template.yaml", work / "fsdp.yaml")  # Accelerate's
    (work / "examples").symlink_to(REPO / "examples")
    return work, _console_dir(tmp_path)


@pytest.fixture
def tour_dir(tmp_path):
    return _newcomer_dir(tmp_path)


def _run(command: str, how: Run, work: Path, bin_dir: Path) -> str:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    if how.cpu:
        env.update({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
        env.pop("CONVOY_INVENTORY", None)
    else:
        box = work / "box.json"
        env["CONVOY_INVENTORY"] = str(box if box.exists() else INVENTORY)
    ran = command + how.then
    if how.dry_run:
        assert command.startswith("convoy launch "), command
        ran = ran.replace("convoy launch ", "convoy launch --dry-run ", 1)
    done = processes.run(["bash", "-c", ran], cwd=work, env=env, capture_output=True, text=True,
                         timeout=240 if how.launches else 60)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{ran}: exit {done.returncode}\n{output[-4000:]}"
    for expected in how.expect:
        found = re.search(expected[3:], output) if expected.startswith("re:") else expected in output
        assert found, f"{ran}: {expected!r} not in\n{output[-4000:]}"
    assert not re.search(r"\w*Warning: |Traceback", output), f"{ran}:\n{output[-4000:]}"
    return output


def test_the_tour_without_launching(tour_dir):
    """The tour's commands that start nothing, in the README's order (box.json written, then replayed), and
    the launcher table's convoy lines as dry runs."""
    work, bin_dir = tour_dir
    for command, how in TOUR.items():
        if isinstance(how, Run) and not how.launches:
            _run(command, how, work, bin_dir)
    assert json.loads((work / "box.json").read_text())["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    for command, expected in LAUNCHER_TABLE.items():
        _run(command, Run(("engine:", *expected), dry_run=True), work, bin_dir)


@pytest.mark.slow
def test_the_tour_launches(tour_dir):
    """The tour's commands that start processes: convoy run, two launches and convoy test."""
    work, bin_dir = tour_dir
    for command, how in TOUR.items():
        if isinstance(how, Run) and how.launches:
            _run(command, how, work, bin_dir)


WRITES = "SKIP writes a settings file (tests/cli/test_config_cli.py runs convoy config)"

#: every ``$ command`` of docs/*.md's example sessions: the inventory it runs on, or why it is not run here
DOCS_CONSOLE: dict[tuple[str, str], str] = {
    ("choosing-a-strategy.md", "convoy plan --params 1.3e9 --hardware 1xA100-80GB"): "8xh100_nvswitch.json",
    ("choosing-a-strategy.md", "convoy plan --params 7e9 --hardware 8xH100-80GB"): "8xh100_nvswitch.json",
    ("choosing-a-strategy.md", "convoy plan llama70b.json --hardware 8xH100-80GB --nodes 4 --inter-gbps 3200 "
                               "--recompute full"): "8xh100_nvswitch.json",
    ("planner.md", "convoy plan llama70b.json --hardware 8xH100-80GB --nodes 4 --recompute full"):
        "8xh100_nvswitch.json",
    ("choosing-a-strategy.md", "convoy launch --strategy zero2 train.py"): "SKIP starts a job (README's tour runs one)",
    ("choosing-a-strategy.md", "convoy launch --nnodes 4 --nproc-per-node 8 --strategy zero1 --dp 4 --tp 2 --pp 4 "
                               "--pp-microbatches 8 --mixed-precision bf16 --recompute full --pp-schedule "
                               "interleaved_1f1b --pp-stages-per-rank 4 --rdzv-backend c10d --rdzv-endpoint "
                               "node0:29500 train.py"):
        "SKIP waits for 3 other machines (tests/plan/test_plan_runs.py dry-runs it)",
    ("choosing-a-strategy.md", "convoy config --strategy zero2"): WRITES,
    ("configuration.md", "convoy config"): "SKIP asks questions on a terminal",
    ("configuration.md", "convoy config --strategy ddp --mixed-precision bf16"): WRITES,
    ("configuration.md", "convoy config --path ./convoy.toml --devices 0,1"): WRITES,
    ("configuration.md", "convoy config --max-restarts ''"): WRITES,
    ("configuration.md", "convoy config show"): "SKIP shows the values the commands above wrote",
    ("configuration.md", "convoy config show --json"): "SKIP shows the values the commands above wrote",
    ("configuration.md", "convoy config keys"): "8xh100_nvswitch.json",
    ("configuration.md", "convoy test"): "SKIP starts a job (README's tour runs it); port and bandwidth vary",
    ("configuration.md", "convoy test --devices 0,1 --size-mib 1024 --json"): "SKIP starts a job",
    ("configuration.md", "convoy launch --max-restarts 3 train.py"): "SKIP starts a job",
    ("devices.md", "convoy devices"): "8gpu_two_islands.json",
    ("devices.md", "CUDA_VISIBLE_DEVICES=4,5,6,7 CUDA_DEVICE_ORDER=PCI_BUS_ID convoy select 1,0 --format index"):
        "8xh100_nvswitch.json",
    ("devices.md", "convoy select 2 --free --order topology --explain --inventory "
                   "tests/inventories/amd_4gpu_xgmi_pairs.json"): "8xh100_nvswitch.json",
    ("launching.md", "convoy launch --dry-run --nnodes 4 train.py"): "8xh100_nvswitch.json",
    ("migrating.md", "convoy launch --dry-run --config_file fsdp.yaml train.py"): "8xh100_nvswitch.json",
    ("launching.md", "PET_NODE_RANK=first convoy launch train.py"): "8xh100_nvswitch.json",
    ("launching.md", "PET_NNODES=2 PET_NODE_RANK=2 PET_MASTER_ADDR=head convoy launch train.py"):
        "8xh100_nvswitch.json",
}


def docs_sessions() -> list[tuple[str, str, list[str]]]:
    """(page, command, the lines the page shows it printing) for every ``$ `` line of docs/*.md's code blocks."""
    found = []
    for page in sorted((REPO / "docs").glob("*.md")):
        for block in _code_blocks(page.read_text(), ("", "console")):
            command, shown = None, []
            for line in [*block, "$ "]:
                if line.startswith("$ "):
                    if command:
                        found.append((page.name, command, shown))
                    command, shown = re.split(r"\s{2,}#", line[2:])[0].strip(), []
                elif line.strip() and line.strip() != "...":
                    shown.append(line)
    return found


def _shows(shown: str, output: str) -> bool:
    """The page's line, its words in order (``...`` for what it leaves out), in a line of the output that starts
    with the same word."""
    words = [w for w in re.split(r"\s+|\.\.\.", shown.strip()) if w]
    for line in output.splitlines():
        have = iter(line.split())
        if line.split()[:1] == words[:1] and all(any(w == h for h in have) for w in words):
            return True
    return False


def test_every_docs_session_is_run_or_skipped_with_a_reason():
    sessions = {(page, command) for page, command, _ in docs_sessions()}
    assert [s for s in sessions if s not in DOCS_CONSOLE] == [], "doc commands this test neither runs nor skips"
    assert [s for s in DOCS_CONSOLE if s not in sessions] == [], "doc commands listed here the docs no longer have"


def _session_outputs(work: Path, bin_dir: Path):
    """(page, command, shown lines, exit code, output) of every docs session this test runs, in the pages' order."""
    shutil.copy(REPO / "tests" / "plan" / "configs" / "llama2_70b.json", work / "llama70b.json")
    (work / "tests").symlink_to(REPO / "tests")
    for page, command, shown in docs_sessions():
        inventory = DOCS_CONSOLE[(page, command)]
        if inventory.startswith("SKIP"):
            continue
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "CONVOY_INVENTORY": str(REPO / "tests" / "inventories" / inventory)}
        done = processes.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=60)
        yield page, command, shown, done.returncode, done.stdout + done.stderr


def _whole(shown: str) -> bool:
    """A line the page shows whole (no ``...``): the output's line, character for character."""
    return "..." not in shown


def test_docs_sessions_print_what_the_pages_show(tour_dir):
    """Each line a page shows is printed: a whole line as it is (its numbers regenerated by
    ``python -m tests.test_readme --regenerate``, never copied by hand), a line with ``...`` word by word."""
    ran = 0
    for page, command, shown, code, output in _session_outputs(*tour_dir):
        refused = [line for line in shown if line.startswith("convoy: ")]
        assert code == (2 if refused else 0), f"{page}: {command}: exit {code}\n{output}"
        missing = [line for line in shown if not _shows(line, output)]
        assert missing == [], f"{page}: {command}: the page shows {missing}, not printed:\n{output[-3000:]}"
        printed = {line.rstrip() for line in output.splitlines()}
        stale = [line for line in shown if _whole(line) and line.rstrip() not in printed]
        assert stale == [], (f"{page}: {command}: these lines differ from what it prints now: {stale}; run "
                             f"python -m tests.test_readme --regenerate\n{output[-3000:]}")
        ran += 1
    assert ran >= 10, ran


def _likeness(printed: str, shown: str) -> tuple[int, float]:
    """How near a printed line is to the page's: the length of their common start, then their likeness."""
    common = next((i for i, (a, b) in enumerate(zip(printed, shown)) if a != b), min(len(printed), len(shown)))
    return common, SequenceMatcher(None, printed, shown).ratio()


def regenerate(work: Path, bin_dir: Path) -> list[str]:
    """Rewrite each whole line the docs' sessions show with the line the command prints now that starts with the
    same word (the page's choice of lines and its ``...`` lines are kept); returns the pages changed."""
    changed: dict[str, str] = {}
    for page, command, shown, _, output in _session_outputs(work, bin_dir):
        path = REPO / "docs" / page
        text = changed.get(page, path.read_text())
        lines = output.splitlines()
        head = text.index(f"$ {command}")  # this session's block: from its command line to the block's end
        end = text.index("```", head)
        block = text[head:end]
        for line in shown:
            if not _whole(line):
                continue
            now = [out.rstrip() for out in lines if out.split()[:1] == line.split()[:1]]
            if now and line.rstrip() not in now:  # the printed line nearest the page's, among those of its first word
                block = block.replace(line, max(now, key=lambda out: _likeness(out, line)), 1)
        changed[page] = text[:head] + block + text[end:]
    written = []
    for page, text in changed.items():
        path = REPO / "docs" / page
        if text != path.read_text():
            path.write_text(text)
            written.append(page)
    return written


if __name__ == "__main__":  # python -m tests.test_readme --regenerate
    import tempfile

    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python -m tests.test_readme --regenerate")
    with tempfile.TemporaryDirectory() as tmp:
        print("rewrote:", ", ".join(regenerate(*_newcomer_dir(Path(tmp)))) or "nothing")


def test_configuration_md_lists_every_settings_key_in_order():
    """docs/configuration.md's "Keys:" paragraph names every key ``convoy config keys`` has, in its order (it lacked
    pp_stages_per_rank once)."""
    from convoy.config.schema import KEYS

    text = (REPO / "docs" / "configuration.md").read_text()
    paragraph = text[text.index("\nKeys: "):].split("\n\n")[0]
    named = list(dict.fromkeys(k for k in re.findall(r"`([a-z0-9_]+)`", paragraph) if k in KEYS))  # first mentions
    assert named == list(KEYS), named

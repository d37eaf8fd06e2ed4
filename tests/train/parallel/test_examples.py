"""The examples train (loss falls) under ``convoy launch`` on 2 CPU processes without a warning; a tp=2
checkpoint resumes at tp=1 through the Accelerator."""

from __future__ import annotations

import re
import sys

import pytest

from tests import processes
from tests.distributed import REPO, cpu_env, run_script

pytestmark = pytest.mark.slow


#: a Python warning ("UserWarning: ...", "FutureWarning: ...") or a line of torch's C++/Python logger ("W1125 ...")
WARNING = re.compile(r"\w*Warning: |\bW\d{4} \d")
#: what importing torchao logs (torch's pytree deprecation of its enums), which transformers does by itself when
#: torchao is installed (the fp8 extra): not convoy's, whose own torchao import silences it
TORCHAO_IMPORT = re.compile(r"torch/utils/_pytree\.py:\d+\] <enum '\w+'> is an Enum subclass")


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if WARNING.search(line) and not TORCHAO_IMPORT.search(line)]


@pytest.mark.parametrize("script, args, launched, nproc, layout", [
    # the launcher's --pp 2 --pp-schedule gpipe --pp-microbatches 2, as their variables
    ("tiny_gpt_pp.py", ["--steps", "11"], {"CONVOY_PARALLELISM": "pp=2", "CONVOY_PP_SCHEDULE": "gpipe",
                                           "CONVOY_PP_MICROBATCHES": "2"}, 2,
     "layout pp2 (dp=1,tp=1,pp=2), schedule gpipe"),
    # zero3 (FSDP2) with the docs' command line (docs/training.md: --strategy zero3)
    ("tiny_gpt.py", ["--steps", "11"], {"CONVOY_STRATEGY": "zero3"}, 2, "strategy=zero3 on 2 process(es)"),
    # the same pipeline script on one process: nothing to split, the loop runs unchanged (pp=1)
    ("tiny_gpt_pp.py", ["--steps", "11"], {}, 1, "layout single (dp=1,tp=1,pp=1)"),
])
def test_example_trains(script, args, launched, nproc, layout):
    """... with the launcher's settings, and prints no warning: FSDP2's "returned a view tensor" (tiny_gpt.py's biased
    output layer) and the pytree FutureWarning of torch's pipeline tracing (tiny_gpt_pp.py) were printed on every
    rank; the examples pass no strategy or schedule of their own, so nothing overrides the launcher."""
    result = run_script(REPO / "examples" / script, nproc=nproc, args=args, env=launched)
    assert result.returncode == 0, result.output
    assert layout in result.output, result.output
    assert "win over what convoy launch was told" not in result.output, result.output
    assert warnings_in(result.output) == [], result.output
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([0-9.]+)", result.output)]
    assert len(losses) == 2 and losses[-1] < 0.5 * losses[0], result.output


def test_tp2_example_trains_and_its_checkpoint_resumes_in_one_plain_process(tmp_path):
    ckpt = tmp_path / "ckpt"
    result = run_script(REPO / "examples" / "tiny_gpt_tp.py", nproc=2, args=["--steps", "11", "--save", str(ckpt)])
    assert result.returncode == 0, result.output
    assert "layout tp2 (dp=1,tp=2,pp=1)" in result.output, result.output
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([0-9.]+)", result.output)]
    assert len(losses) == 2 and losses[-1] < 0.5 * losses[0], result.output
    saved = re.search(r"next loss ([0-9.]+)", result.output)
    assert saved, result.output
    env = {k: v for k, v in cpu_env().items() if k not in ("CONVOY_PARALLELISM", "CONVOY_STRATEGY")}
    loaded = processes.run([sys.executable, str(REPO / "tests/train/parallel/scripts/load_at_tp1.py"), str(ckpt),
                             "11", "8"], capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"},
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    resumed = re.search(r"next loss ([0-9.]+)", loaded.stdout)
    assert resumed and abs(float(resumed.group(1)) - float(saved.group(1))) < 1e-5, (saved, loaded.stdout)


def test_a_script_argument_that_differs_from_the_launcher_wins_and_is_said_once():
    """The issue's case: the launcher was told ddp (the plan's line), the script asks for zero3. The script's
    argument wins, as in Accelerate, and one line on rank 0 says so (before, nothing did)."""
    result = run_script(REPO / "examples" / "tiny_gpt.py", nproc=2, args=["--steps", "1", "--strategy", "zero3"],
                        env={"CONVOY_STRATEGY": "ddp", "CONVOY_MIXED_PRECISION": "no"})
    assert result.returncode == 0, result.output
    said = [line for line in result.output.splitlines() if "win over what convoy launch was told" in line]
    assert said == ["[rank0]: convoy: the script's Accelerator(...) arguments win over what convoy launch was told: "
                    "strategy='zero3' (the launcher's --strategy: 'ddp'); leave them out of the script to run the "
                    "launcher's"], result.output
    assert "strategy=zero3 on 2 process(es)" in result.output, result.output


def test_the_train_py_of_the_plans_line_trains_a_planned_factory_or_config_with_the_launchers_settings(tmp_path):
    """examples/train.py is the train.py of convoy plan's line: a MODULE:FUNCTION factory or a config.json, with the
    line's strategy, precision and accumulation (as the launcher's variables), none of its own."""
    planned = {"CONVOY_STRATEGY": "ddp", "CONVOY_MIXED_PRECISION": "bf16", "CONVOY_GRADIENT_ACCUMULATION_STEPS": "2"}
    result = run_script(REPO / "examples" / "train.py", nproc=2, env=planned, cwd=REPO,
                        args=["--model", "examples/tiny_gpt.py:TinyGPT", "--seq-len", "32", "--steps", "4"])
    assert result.returncode == 0, result.output
    assert "strategy=ddp, 2 process(es), mixed_precision=bf16, gradient_accumulation_steps=2" in result.output
    assert len(re.findall(r"step +\d+ +loss [0-9.]+", result.output)) == 2, result.output
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, '
                      '"n_positions": 16, "bos_token_id": 0, "eos_token_id": 0}')
    result = run_script(REPO / "examples" / "train.py", nproc=1, env={"CONVOY_STRATEGY": "zero2"},
                        args=["--model", str(config), "--seq-len", "16", "--steps", "2"])
    assert result.returncode == 0 and "strategy=zero2, 1 process(es)" in result.output, result.output
    assert warnings_in(result.output) == [], result.output

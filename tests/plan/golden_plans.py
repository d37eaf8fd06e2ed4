"""The plans whose full output ``test_plan_golden.py`` pins: several models, boards and options.

    python -m tests.plan.golden_plans --write     # capture today's outputs into data/plan_golden.json

Written before the planner was made faster (issue 38, item 4), so a speed-up that changes a printed digit fails.
Write the file again only when the model is meant to change.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "plan_golden.json"
CONFIGS = HERE / "configs"

# Each case: the argv of ``convoy plan`` after the command name (both --json and the printed table are pinned).
CASES: dict[str, list[str]] = {
    "70b-8xh100": ["--params", "70e9", "--hardware", "8xH100-80GB"],
    "llama2-70b-4x8xh100-3200": [str(CONFIGS / "llama2_70b.json"), "--hardware", "8xH100-80GB", "--nodes", "4",
                                 "--inter-gbps", "3200", "--seq-len", "4096"],
    "llama2-7b-8xa100-40-full": [str(CONFIGS / "llama2_7b.json"), "--hardware", "8xA100-40GB", "--recompute", "full",
                                 "--micro-batch", "2"],
    "llama2-7b-8xh100-fp8-compile": [str(CONFIGS / "llama2_7b.json"), "--hardware", "8xH100-80GB", "--compile",
                                     "blocks", "--fp8", "rowwise", "--seq-len", "8192"],
    "pythia-160m-16xh100-selective": [str(CONFIGS / "pythia_160m.json"), "--hardware", "8xH100-80GB", "--nodes", "2",
                                  "--recompute", "selective"],
    "gpt2-2xl40s-eager-fp16": [str(CONFIGS / "gpt2.json"), "--hardware", "2xL40S", "--attention", "eager",
                               "--precision", "fp16", "--dropout"],
    "pythia-410m-4xa100-pcie-sgd": [str(CONFIGS / "pythia_410m.json"), "--hardware", "4xA100-80GB", "--intra",
                                    "pcie", "--optimizer", "sgd-momentum", "--global-batch", "64"],
    "qwen-0.5b-1xh100-inference": [str(CONFIGS / "qwen2_0_5b.json"), "--hardware", "1xH100-80GB", "--optimizer",
                                   "none", "--no-offload"],
    "13b-8x8xa100-zero": ["--params", "13e9", "--hardware", "8xA100-80GB", "--nodes", "8", "--strategies",
                          "zero1,zero3,hsdp,tp,pp", "--efficiency", "0.4", "--seq-len", "4096"],
    "405b-16x8xh100-fp32-accum": ["--params", "405e9", "--hardware", "8xH100-80GB", "--nodes", "16",
                                  "--precision", "bf16-fp32-accum", "--global-batch", "512"],
}


def _convoy(argv: list[str]) -> str:
    from convoy.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["plan", *argv])
    if rc != 0:
        raise RuntimeError(f"convoy plan {' '.join(argv)} exited {rc}")
    # Paths differ between checkouts; the outputs name the config file.
    return out.getvalue().replace(str(CONFIGS), "<configs>")


def outputs(name: str) -> dict[str, str]:
    """The JSON and the printed table of one case, as the CLI prints them."""
    argv = CASES[name]
    return {"json": _convoy([*argv, "--json"]), "text": _convoy(argv)}


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    GOLDEN.write_text(json.dumps({name: outputs(name) for name in CASES}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The settings schema: names line up with the launcher's environment contract, and stay torch-free."""

from __future__ import annotations

import subprocess
import sys

from convoy.config.schema import KEYS, SCHEMA, closest_key


def test_env_names_match_the_launch_contract():
    # convoy launch exports these to every rank and the Accelerator reads them (design contract 2).
    for var in ("CONVOY_MIXED_PRECISION", "CONVOY_STRATEGY", "CONVOY_PARALLELISM",
                "CONVOY_GRADIENT_ACCUMULATION_STEPS", "CONVOY_COLLECTIVE_TIMEOUT"):
        assert var in {k.env_var for k in SCHEMA}
    assert KEYS["collective_timeout"].default == 300.0


def test_every_key_is_documented_and_its_default_is_valid():
    for key in SCHEMA:
        assert key.doc.endswith(".") and key.flag.startswith("--")
        if key.default is not None:
            assert key.parse(key.default, where="default") == key.default


def test_closest_key():
    assert closest_key("mixed-precision") == "mixed_precision"
    assert closest_key("gradient_accumulation") == "gradient_accumulation_steps"
    assert closest_key("qqqqqqq") is None


def test_config_package_does_not_import_torch():
    code = ("import sys, convoy.config as c; c.effective_settings(env={'CONVOY_PARALLELISM': 'dp=2'}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

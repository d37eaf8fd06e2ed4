"""``convoy env``: everything a bug report needs, as text or JSON.

    convoy env                 # convoy, Python, torch and its builds, driver, NCCL, devices, variables, settings
    convoy env --json > env.json
    convoy env --no-torch      # skip importing torch (faster; the torch section says it was skipped)

Library: ``convoy.config.report.collect_report()`` and ``format_report()``.
"""

from __future__ import annotations

import argparse
import json

from convoy.config.report import collect_report, format_report

DESCRIPTION = ("Print everything a bug report needs: convoy, Python, torch and its builds, CUDA driver, NCCL, "
               "the device table, visibility variables in force and what set them, and the settings.")
EPILOG = """examples:
  convoy env                               read it before filing an issue
  convoy env --json > env.json             attach this file to the issue
  CONVOY_INVENTORY=box.json convoy env     report a machine from its inventory snapshot
  convoy env --no-torch                    skip the torch section (no torch import)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-torch", action="store_true", help="do not import torch (its section is skipped)")


def run(args: argparse.Namespace) -> int:
    report = collect_report(include_torch=not args.no_torch)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(format_report(report), end="")
    return 0

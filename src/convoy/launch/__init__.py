"""convoy.launch: start one process per device, on one machine or many.

    convoy launch --devices 0,2 train.py            # the command (convoy.cli.launch)
    convoy.launch(fn, args=(), nproc_per_node=2)     # a function on several processes (function.py)

Modules: ``resolve`` (flags + Selection + Slurm env -> frozen LaunchPlan), ``rank_env`` (the rank environment
contract), ``workers`` (the direct single-node engine, torch-free), ``elastic`` (torch's agent for several
nodes and restarts), ``failures`` (first failing rank and its traceback), ``slurm``, ``ports``, ``job``
(what the command calls), ``function`` (``convoy.launch(fn)``), ``record`` (each Python worker's program: error
files for unmodified scripts), ``worker_exit`` (how that worker ends: its status, its objects finalized, without
the C-level teardown).

``convoy.launch`` is both this package and the function: once a submodule is imported, Python binds the
package to the name ``convoy.launch``, so the package itself is made callable and forwards to
``convoy.launch.function.launch``.
"""

from __future__ import annotations

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from convoy.launch.function import launch

        return launch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

"""The published-run tables of ``benchmarks/`` as modules, for the tests that check them (``benchmarks/`` is not a
package): ``load("published_heldout2")``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, loaded once per process (the held-out tables import ``published_results``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def earlier_rows(name: str) -> list[Any]:
    """The development table's rows and those of every held-out table of an earlier set than ``name``'s
    (``published_results.HELD_OUT_MODULES``, in the order the sets were collected, and ``HELD_OUT_SET``): what a
    held-out table's rows must not repeat. The tables of one set were collected side by side from other sources, and
    two publications of one run's inputs may stand in both (the fourth set's N4B8 and O4T2, N4B15 and O4T5)."""
    development = load("published_results")
    names, sets = development.HELD_OUT_MODULES, development.HELD_OUT_SET
    earlier = [other for other in names[:names.index(name)] if sets[other] != sets[name]]
    return [*development._ROWS, *(row for other in earlier for row in load(other).ROWS)]


def gpus(row: Any) -> int:
    """The GPUs a published row ran on."""
    return row.gpus_per_node * row.nodes


def run_of(row: Any, *, layout: bool = False) -> tuple:
    """What makes a run (model, board, GPUs, batch, micro-batch, sequence, how it computed; with ``layout``, its
    layout too): two rows with the same are the same run, whichever table holds them."""
    return (row.model.name, row.gpu, gpus(row), row.global_batch, row.micro_batch, row.seq,
            *((row.layout_name,) if layout else ()), row.how)


def check_layout_fills_the_gpus(row: Any, *, pipeline: bool = True) -> None:
    """The row's layout multiplies to its GPUs and splits its batch, heads, sequence and layers; with ``pipeline``,
    a pipeline has a micro-batch per stage at least and Megatron's interleaved schedule whole rounds of them."""
    d = row.dims
    assert d.world_size == gpus(row)
    assert row.global_batch % (row.micro_batch * d.dp) == 0
    assert row.model.heads % d.tp == 0 and row.seq % d.cp == 0 and row.model.num_layers >= d.pp
    if pipeline and d.pp > 1:
        assert row.global_batch // (row.micro_batch * d.dp) >= d.pp
    if pipeline and row.pp_stages_per_rank > 1:
        assert row.model.num_layers % (d.pp * row.pp_stages_per_rank) == 0
        assert (row.global_batch // (row.micro_batch * d.dp)) % d.pp == 0


def check_rows_are_new(rows: Any, others: Any, *, layout: bool = False) -> None:
    """No key of ``rows`` is in ``others``, no run of them repeats one of ``others``, and none repeats another."""
    assert not {row.key for row in rows} & {row.key for row in others}
    seen = {run_of(row, layout=layout) for row in others}
    for row in rows:
        assert run_of(row, layout=layout) not in seen, row.key
    assert len({run_of(row, layout=layout) for row in rows}) == len(rows)


def check_parameter_count(row: Any, table: ModuleType) -> None:
    """The row's model has the parameters its source gives (``table.SOURCE_PARAMS``), within 3 % or the
    tolerance ``table.ROUNDED_NAMES`` gives a model known by a rounded name."""
    params, _where = table.SOURCE_PARAMS[row.key]
    tolerance = getattr(table, "ROUNDED_NAMES", {}).get(row.key, 0.03)
    assert abs(row.model.num_params / params - 1) <= tolerance, row.model.num_params

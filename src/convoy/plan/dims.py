"""Parallel degrees of a job: how the world of processes is split into dp x cp x tp x pp.

    dims = ParallelDims.parse("dp=2,tp=2", world_size=4)
    dims.tp, dims.dp, dims.mesh_shape()       # 2, 2, (("dp", 2), ("tp", 2))
    dims.check_divides(num_heads=8, num_layers=4)

Plain data and arithmetic, no torch: the planner enumerates these, the launcher validates ``--dp/--tp/--pp``
with them, and the training layer builds its ``DeviceMesh`` from ``mesh_shape()`` in one function elsewhere.
``dp`` is data parallel as a whole; it splits into ``dp_replicate`` (plain replicas, DDP-style) times
``dp_shard`` (ZeRO-3/FSDP sharding). HSDP is ``dp_replicate > 1`` and ``dp_shard > 1``. ``cp`` (context
parallel) splits each sequence over its ranks: they read the same samples (data is sharded over dp only) and
FSDP shards the weights over ``dp_shard x cp``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from convoy.errors import StrategyError, shown

__all__ = ["ParallelDims", "divisors"]

_KEYS = ("dp", "dp_replicate", "dp_shard", "cp", "tp", "pp")
#: a degree is a plain ASCII number of at most 9 digits (no job has a billion ranks); "dp=²" is refused.
_DEGREE = re.compile(r"[0-9]{1,9}")


#: a value in an error message (``convoy.errors.shown``)
_show = functools.partial(shown, huge="<a number too large to be a degree>")


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Degrees of parallelism; their product is the world size."""

    dp_replicate: int = 1
    """Data-parallel replicas that each hold the whole (possibly tp/pp-split) model."""
    dp_shard: int = 1
    """Data-parallel ranks that shard parameters, gradients and optimizer state between them."""
    tp: int = 1
    """Tensor-parallel degree: each layer's matrices are split over this many ranks."""
    pp: int = 1
    """Pipeline-parallel degree: the layers are cut into this many stages."""
    cp: int = 1
    """Context-parallel degree: each sequence is split over this many ranks (ring attention between them)."""

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "pp", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StrategyError(f"parallelism {name}={_show(value)}: each degree must be a whole number >= 1")

    @property
    def dp(self) -> int:
        """Total data-parallel degree (replicas x shards)."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def dp_enabled(self) -> bool:
        """True when more than one process reads different data (dp > 1)."""
        return self.dp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        """True when the model is kept as more than one plain replica (dp_replicate > 1)."""
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """True when parameters, gradients and optimizer state are sharded over more than one rank (dp_shard > 1)."""
        return self.dp_shard > 1

    @property
    def hsdp_enabled(self) -> bool:
        """True for HSDP: sharded groups that are themselves replicated (dp_replicate > 1 and dp_shard > 1)."""
        return self.dp_replicate_enabled and self.dp_shard_enabled

    @property
    def tp_enabled(self) -> bool:
        """True when each layer's matrices are split over more than one rank (tp > 1)."""
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        """True when the layers are cut into more than one stage (pp > 1)."""
        return self.pp > 1

    @property
    def cp_enabled(self) -> bool:
        """True when each sequence is split over more than one rank (cp > 1)."""
        return self.cp > 1

    @property
    def dp_cp(self) -> int:
        """The ranks a gradient and the loss are averaged over (dp x cp): FSDP shards over dp_shard x cp."""
        return self.dp * self.cp

    @property
    def is_trivial(self) -> bool:
        """True when there is no model or sequence parallelism (tp = pp = cp = 1)."""
        return self.tp == 1 and self.pp == 1 and self.cp == 1

    def mesh_shape(self) -> tuple[tuple[str, int], ...]:
        """Named mesh dimensions, outermost first (pp, dp_replicate, dp_shard, cp, tp), degree-1 ones dropped.

        tp is innermost so that its ranks are neighbours (same node, fastest links), cp next (its ring moves K/V
        blocks every layer). Never empty: a world of one process has the single dimension ("dp_shard", 1).
        """
        dims = (("pp", self.pp), ("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("cp", self.cp),
                ("tp", self.tp))
        kept = tuple((name, size) for name, size in dims if size > 1)
        return kept or (("dp_shard", 1),)

    def check_world_size(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise StrategyError(
                f"parallelism {self.describe()} needs {self.world_size} processes but the job has {world_size}; "
                f"make the product of the degrees equal {world_size}"
            )

    def check_divides(self, *, num_heads: int | None = None, num_layers: int | None = None) -> None:
        """Raise ``StrategyError`` unless tp divides the attention heads and pp divides the layers."""
        if num_heads is not None and num_heads % self.tp:
            raise StrategyError(f"tp={self.tp} does not divide the model's {num_heads} attention heads; "
                                f"choose a tp in {divisors(num_heads)}")
        if num_layers is not None and num_layers < self.pp:
            raise StrategyError(f"pp={self.pp} is more stages than the model's {num_layers} layers; "
                                f"choose pp <= {num_layers}")

    def describe(self) -> str:
        parts = [f"dp={self.dp}"] if not self.hsdp_enabled else [
            f"dp_replicate={self.dp_replicate}", f"dp_shard={self.dp_shard}"]
        return ",".join(parts + [f"cp={self.cp}"] * self.cp_enabled + [f"tp={self.tp}", f"pp={self.pp}"])

    @classmethod
    def from_mapping(cls, degrees: Mapping[str, int], *, world_size: int | None = None,
                     shard_dp: bool = False) -> ParallelDims:
        """Build from ``{"dp": 2, "cp": 2, "tp": 2}``; a missing ``dp`` is inferred from ``world_size``.

        ``dp`` maps to ``dp_shard`` when ``shard_dp`` (FSDP over the dp dimension), else to ``dp_replicate``.
        """
        if not isinstance(degrees, Mapping):
            raise StrategyError(f"parallelism={_show(degrees)}: give degrees as a mapping like {{'dp': 2, 'tp': 2}} "
                                f"or a string like 'dp=2,tp=2'")
        unknown = sorted((k for k in degrees if k not in _KEYS), key=str)
        if unknown:
            raise StrategyError(f"unknown parallelism key {_show(unknown[0])}; use {', '.join(_KEYS)}")
        values = dict(degrees)
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StrategyError(f"parallelism {key}={_show(value)}: each degree must be a whole number >= 1")
        tp, pp, cp = values.get("tp", 1), values.get("pp", 1), values.get("cp", 1)
        if "dp" in values and ("dp_replicate" in values or "dp_shard" in values):
            raise StrategyError("give either dp or dp_replicate/dp_shard, not both")
        if "dp" not in values and "dp_replicate" not in values and "dp_shard" not in values:
            if world_size is None:
                values["dp"] = 1
            elif world_size % (tp * pp * cp):
                split = f"cp={cp} x " * (cp > 1)
                raise StrategyError(f"{split}tp={tp} x pp={pp} does not divide the world size {world_size}")
            else:
                values["dp"] = world_size // (tp * pp * cp)
        if "dp" in values:
            dp = values["dp"]
            rep, shard = (1, dp) if shard_dp else (dp, 1)
        else:
            rep, shard = values.get("dp_replicate", 1), values.get("dp_shard", 1)
        dims = cls(dp_replicate=rep, dp_shard=shard, tp=tp, pp=pp, cp=cp)
        if world_size is not None:
            dims.check_world_size(world_size)
        return dims

    @classmethod
    def parse(cls, text: str, *, world_size: int | None = None, shard_dp: bool = False) -> ParallelDims:
        """Parse ``"dp=2,cp=2,tp=2,pp=1"`` (the ``CONVOY_PARALLELISM`` / ``--dp --cp --tp --pp`` form)."""
        if not isinstance(text, str):
            raise StrategyError(f"parallelism={_show(text)}: give degrees as a string like 'dp=2,tp=2'")
        degrees: dict[str, int] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not _DEGREE.fullmatch(value.strip()):
                raise StrategyError(f"parallelism {_show(text)}: {_show(item)} is not KEY=NUMBER (e.g. 'dp=2,tp=2')")
            degrees[key.strip()] = int(value)
        return cls.from_mapping(degrees, world_size=world_size, shard_dp=shard_dp)


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order, in O(sqrt n) steps (the world size can be large)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]

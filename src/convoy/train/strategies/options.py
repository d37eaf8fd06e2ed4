"""The ``strategy_options`` each strategy family reads, as one typed record with a docstring per field.

    options = ParallelOptions.parse({"loss_fn": F.cross_entropy, "pp_schedule": "1f1b"})
    options.loss_fn, options.pipeline().schedule      # (F.cross_entropy, "1f1b")
    DDPOptions.keys()                                 # the keys strategy "ddp" accepts

The user's dict (``Accelerator(strategy_options={...})``, kept as ``TrainSettings.options``) keeps its keys. A
strategy parses it once, when it is built (``Strategy.config``), and reads fields from then on; ``parse`` takes the
keys its record has and leaves the others, which ``Accelerator(...)`` refuses beforehand against ``keys()``
(``convoy.train.strategies.base.check_strategy_options``). A field left at ``None`` means "not given": the
engine's own default applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from convoy.train.parallel.pipeline import PipelineConfig

__all__ = ["StrategyOptions", "DDPOptions", "ShardOptions", "ParallelOptions"]

_Options = TypeVar("_Options", bound="StrategyOptions")


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    """The options of a strategy that reads none (``single``, ``dp``, and the base of the others)."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The ``strategy_options`` keys this record reads, in field order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def parse(cls: type[_Options], options: Mapping[str, Any] | StrategyOptions) -> _Options:
        """The record for ``options`` (the user's dict, or another family's record): the keys it has, the others
        left (an unknown one is ``check_strategy_options``'s to refuse); a record of this class is returned as is."""
        if isinstance(options, cls):
            return options
        if isinstance(options, StrategyOptions):
            options = {f.name: getattr(options, f.name) for f in fields(options)}
        known = cls.keys()
        return cls(**{key: value for key, value in dict(options).items() if key in known})


@dataclass(frozen=True, kw_only=True)
class DDPOptions(StrategyOptions):
    """``strategy="ddp"`` and ``"zero1"``: ``DistributedDataParallel``'s arguments (Accelerate's
    ``DistributedDataParallelKwargs`` give the same) and a gradient communication hook of PyTorch's."""

    find_unused_parameters: bool | None = None
    """Look for parameters the forward did not use (a model whose branches change per step)."""
    broadcast_buffers: bool | None = None
    """Send rank 0's buffers (batch-norm statistics) to every rank at each forward."""
    bucket_cap_mb: float | None = None
    """Size of a gradient bucket, in MB (DDP's default: 25)."""
    static_graph: bool | None = None
    """The set of used parameters and the graph are the same at every step (DDP can then skip its checks)."""
    gradient_as_bucket_view: bool | None = None
    """Gradients are views into the buckets: one copy less, the same numbers."""
    comm_hook: Any = None
    """The hook that sends the gradients: ``"fp16"``, ``"bf16"``, ``"power_sgd"``, ``"batched_power_sgd"`` (or
    ``DDPCommunicationHookType``); ``None``/``"no"``: plain all-reduce (``convoy.train.strategies.ddp.comm_hook``)."""
    comm_wrapper: Any = None
    """Compress what the hook sends: ``"fp16"`` or ``"bf16"``; ``None``/``"no"``: as it is."""
    comm_state_option: Mapping[str, Any] | None = None
    """``PowerSGDState``'s arguments (``{"matrix_approximation_rank": 2}``), with a PowerSGD hook only."""

    def ddp_kwargs(self) -> dict[str, Any]:
        """The ``DistributedDataParallel(...)`` keyword arguments given (the others keep DDP's defaults)."""
        names = ("find_unused_parameters", "broadcast_buffers", "bucket_cap_mb", "static_graph",
                 "gradient_as_bucket_view")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclass(frozen=True, kw_only=True)
class ShardOptions(StrategyOptions):
    """``strategy="zero2"``, ``"zero3"`` and ``"fsdp"``: how FSDP2 shards the model."""

    auto_wrap: Any = None
    """Module classes, or their names (Accelerate's ``transformer_cls_names_to_wrap``), to shard one by one; the
    blocks activation recomputation checkpoints too. ``None``: every entry of the model's ``nn.ModuleList``\\ s."""
    cpu_offload: bool = False
    """Keep the shards (and the optimizer step) in host memory (FSDP2's ``CPUOffloadPolicy``)."""


#: the ``ParallelOptions`` fields that make its ``PipelineConfig`` (strategy option -> ``PipelineConfig`` field)
_PIPELINE_FIELDS = ("pp_schedule", "pp_microbatches", "pp_stages_per_rank", "pp_split_at", "pp_layers")


@dataclass(frozen=True, kw_only=True)
class ParallelOptions(StrategyOptions):
    """``strategy="parallel"``, ``"tp"``, ``"pp"`` and ``"hsdp"``: how each axis of dp x tp x pp is run; also what
    ``strategy="auto"`` reads to decide which tp and pp degrees a model can take."""

    tp_plan: Mapping[str, str] | None = None
    """Module patterns -> tensor-parallel styles (``{"*.q_proj": "colwise"}``); ``None``: the model's declared plan,
    else convoy's default for projection names (``convoy.train.parallel.tensor.resolve_tp_plan``)."""
    sequence_parallel: bool = False
    """Shard the activations between blocks along the sequence (norms and dropout run on 1/tp of the tokens)."""
    loss_fn: Callable[..., Any] | None = None
    """``loss_fn(output, target)``: the loop trains with ``loss = model(x, target=y)``, which a pipeline needs
    (a transformers causal LM brings its own loss); its presence also tells ``"auto"`` the loop is a pipeline's."""
    dp_engine: str | None = None
    """How dp is run: ``"fsdp"``, ``"zero2"``, ``"ddp"`` or ``"zero1"``; ``None``: ``"zero1"`` beside pp alone,
    else ``"fsdp"`` (``ParallelStrategy.default_engine``)."""
    auto_wrap: Any = None
    """As ``ShardOptions.auto_wrap``: the blocks FSDP2 shards one by one and recomputation checkpoints."""
    pp_schedule: str | None = None
    """The pipeline schedule (``convoy.plan.schedules.SCHEDULES``: ``"1f1b"``, ``"gpipe"``, ``"interleaved_1f1b"``,
    ...); ``None``: ``"1f1b"``."""
    pp_microbatches: int | None = None
    """Micro-batches each batch is cut into; must divide the batch. ``None``: the number of stages."""
    pp_stages_per_rank: int | None = None
    """Stages each process holds (above 1 with the interleaved and looped schedules only; their default is 2)."""
    pp_split_at: Any = None
    """Module names where stages 1, 2, ... begin (a tuple, or one comma-separated string); ``None``: cut
    ``pp_layers`` evenly."""
    pp_layers: str | None = None
    """The ``nn.ModuleList`` to cut evenly; ``None``: the model's largest one."""
    find_unused_parameters: bool = False
    """DDP's ``find_unused_parameters`` where the dp engine is DDP."""
    cpu_offload: bool = False
    """As ``ShardOptions.cpu_offload``, for the FSDP2 engines."""
    cp_comm_strategy: str = "allgather"
    """With cp > 1: how the ring passes K/V blocks, ``"allgather"`` (default) or ``"alltoall"`` (Accelerate's
    ``TorchContextParallelConfig.cp_comm_strategy``, torch's ``set_rotate_method``)."""

    def __post_init__(self) -> None:
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            from convoy.errors import StrategyError

            raise StrategyError(f"cp_comm_strategy={self.cp_comm_strategy!r}: choose 'allgather' or 'alltoall'")
        # read as yes/no wherever they are used
        object.__setattr__(self, "sequence_parallel", bool(self.sequence_parallel))
        object.__setattr__(self, "find_unused_parameters", bool(self.find_unused_parameters))

    def pipeline(self) -> PipelineConfig:
        """The pipeline these options ask for (``StrategyError`` for a bad schedule or count)."""
        from convoy.train.parallel.pipeline import PipelineConfig

        return PipelineConfig.from_options({name: getattr(self, name) for name in _PIPELINE_FIELDS
                                            if getattr(self, name) is not None})

"""Every setting convoy reads: its name, type, default and meaning, in one table.

    from convoy.config.schema import SCHEMA, key_for
    key_for("mixed_precision").parse("bf16", where="flag --mixed-precision")   # -> "bf16"
    [k.name for k in SCHEMA]                                                    # every key, in order

A key has one spelling per place it can come from: ``strategy`` in a TOML file, ``--strategy`` on the
command line, ``CONVOY_STRATEGY`` in the environment. Values from files keep their TOML types; values from
flags and the environment are strings and are converted by the key's type. A wrong value raises
``ConfigError`` naming where it came from and what would be right. Torch-free.

Numbers are ASCII digits only (``²`` and ``٣`` are refused though Python's ``int()`` reads them), whole
numbers have at most 12 digits, and seconds must be finite. This module is also the one source of the
choices the launcher and the trainer share: ``MIXED_PRECISIONS``, ``RECOMPUTE_MODES``, ``DEFAULT_COLLECTIVE_TIMEOUT``
and ``BUILTIN_STRATEGIES`` (``convoy launch`` refuses other values in the parent, before any rank starts), and how a
data-parallel strategy runs beside tp/pp degrees (``dp_engine_beside``: ``--strategy zero3 --tp 2``).
"""

from __future__ import annotations

import difflib
import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from convoy.errors import ConfigError, shown
from convoy.plan.run import RECOMPUTE  # torch-free: the planner's modes are the trainer's

__all__ = ["Key", "SCHEMA", "KEYS", "key_for", "closest_key", "ENV_PREFIX", "MixedPrecision", "MIXED_PRECISIONS",
           "FP8_RECIPES", "RECOMPUTE_MODES", "COMPILE_SCOPES", "COMPILE_MODES", "DEFAULT_COLLECTIVE_TIMEOUT",
           "BUILTIN_STRATEGIES", "DP_ENGINES", "dp_engine_beside", "PP_SCHEDULES", "OFFLOADING", "check_offload",
           "parse_whole",
           "is_whole", "is_host"]

ENV_PREFIX = "CONVOY_"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_NNODES = re.compile(r"^[0-9]{1,12}(:[0-9]{1,12})?$")
_WHOLE = re.compile(r"\s*-?[0-9]{1,12}\s*")
_SECONDS = re.compile(r"\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]{1,3})?\s*")

class MixedPrecision(str, enum.Enum):
    """A mixed-precision mode: the launcher offers exactly these and the trainer runs them (a ``str``, so
    ``settings.mixed_precision == "bf16"`` holds). What each means for torch is stated here, once."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def compute_dtype(self) -> str | None:
        """The ``torch`` dtype name autocast computes in (``"bfloat16"``); None: fp32, no autocast. fp8 computes its
        converted linears' GEMMs in float8 (torchao's ``Float8Linear``) and the rest under bf16 autocast, as
        torchtitan and Accelerate do."""
        return {"fp16": "float16", "bf16": "bfloat16", "fp8": "bfloat16"}.get(self.value)

    @property
    def scales_loss(self) -> bool:
        """True when the loss is scaled against fp16's narrow range (``torch.amp.GradScaler``)."""
        return self is MixedPrecision.FP16


#: the mixed-precision modes the trainer implements, as the strings flags, variables and files use.
MIXED_PRECISIONS = tuple(mode.value for mode in MixedPrecision)
#: float8 training's scaling recipes (torchao's ``Float8LinearConfig.from_recipe_name``): one scale per tensor, the
#: default, with FSDP2 gathering weights in float8; one per row; one per row with the weight gradient's GEMM in bf16
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: activation recomputation as the trainer runs it and the planner plans it: "none", "selective" (per-op: the outputs
#: of matmuls and attention kept, the rest of each block recomputed) or "full" (each block's input kept only)
RECOMPUTE_MODES = RECOMPUTE
#: what torch.compile compiles (``convoy.train.parallel.compile``): nothing, each repeated block in place
#: (``fullgraph=True``, torchtitan's recipe), or the whole model
COMPILE_SCOPES = ("none", "blocks", "model")
#: ``torch.compile(mode=...)``, passed through as torch spells them
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: the levels of Python's logging, as CONVOY_LOG_LEVEL and ``get_logger(log_level=)`` take them
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: seconds a collective may wait for the other ranks (torch's own default is 30 minutes).
DEFAULT_COLLECTIVE_TIMEOUT = 300.0
#: strategy names convoy ships (``convoy.train.strategies``); a strategy a
#: script registers itself (``register_strategy``) is chosen in that script, ``Accelerator(strategy=...)``.
BUILTIN_STRATEGIES = ("auto", "single", "dp", "ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "parallel", "tp", "pp")
#: the ``dp_engine`` (of strategy "parallel") that runs each data-parallel strategy over dp beside tp/pp degrees:
#: FSDP2 resharding after forward (zero3, fsdp) or keeping the gathered weights until the backward (zero2), whole
#: replicas with all-reduced gradients (ddp: DDP, or beside tp, whose weights are DTensors, FSDP2's replicate), or
#: the optimizer state sharded (zero1: DDP with ``ZeroRedundancyOptimizer``, or beside tp FSDP2 keeping the
#: gathered weights through the step; convoy.train.strategies.parallel.realisation)
DP_ENGINES = {"zero3": "fsdp", "fsdp": "fsdp", "zero2": "zero2", "ddp": "ddp", "zero1": "zero1"}
#: the pipeline schedules the trainer runs (``convoy.train.parallel.pipeline.SCHEDULES``, which imports torch)
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs")
#: the strategies ``cpu_offload`` applies to: those that shard with FSDP2 (its ``CPUOffloadPolicy``), and
#: strategy "parallel" (with tp/pp), whose FSDP2 engines offload as zero3 does
OFFLOADING = ("zero2", "zero3", "fsdp", "hsdp", "parallel", "tp", "pp")
#: the strategies that read the degrees themselves (hsdp: dp_replicate x dp_shard beside any tp, pp)
_TAKE_DEGREES = ("auto", "parallel", "tp", "pp", "hsdp")


def dp_engine_beside(strategy: str, dims: Any, *, said: str | None = None) -> str | None:
    """How strategy ``strategy`` runs at degrees ``dims`` (a ``convoy.plan.dims.ParallelDims``; None: none given):
    the ``dp_engine`` of strategy "parallel" when a data-parallel strategy is asked for beside tp or pp (or HSDP's
    dp_replicate x dp_shard), so ``--strategy zero3 --tp 2`` runs FSDP2 over dp with tensor parallelism inside;
    None when the strategy runs as named (no such degrees, a strategy that reads them itself, or one a script
    registers). With dp = 1 the data-parallel strategy has nothing to do and the degrees run as they are
    (``--strategy ddp --tp 8`` on 8 processes). A pair the trainer cannot run is one error, whatever the world size:
    ``StrategyError`` for single and dp (one replica of the whole model per process, or per machine), and for ddp
    and zero1 with HSDP's dp_replicate x dp_shard, which shard each replica (strategy ``hsdp``). ``said``: how the
    message names the strategy (default ``strategy='ddp'``).

        dp_engine_beside("zero3", ParallelDims(tp=2))     # "fsdp"
        dp_engine_beside("zero1", ParallelDims(pp=2))     # "zero1"
        dp_engine_beside("ddp", ParallelDims(dp_replicate=2, tp=2))   # "ddp": whole replicas of DTensor weights
    """
    from convoy.errors import StrategyError

    hsdp = dims is not None and dims.hsdp_enabled
    if dims is None or strategy in _TAKE_DEGREES or (dims.is_trivial and not hsdp):
        return None
    named = said or f"strategy={strategy!r}"
    split = ", ".join(f"{axis}={getattr(dims, axis)}" for axis in ("cp", "tp", "pp") if getattr(dims, axis) > 1)
    split = split or f"dp_replicate={dims.dp_replicate} x dp_shard={dims.dp_shard} (HSDP)"
    if strategy in ("single", "dp"):
        raise StrategyError(f"{named} runs the whole model in one process, not split by {split}; use strategy "
                            f"'parallel' (or a data-parallel strategy: 'zero3', 'ddp', ...) with these degrees")
    if strategy not in DP_ENGINES:
        return None  # a strategy the script registers reads the degrees itself
    if strategy in ("ddp", "zero1") and hsdp:
        raise StrategyError(f"{named} keeps whole weights in each replica, but {split} shards the weights of each "
                            f"replica, which only FSDP2 does; use strategy 'hsdp' (or 'zero3') with these degrees")
    return DP_ENGINES[strategy]


def check_offload(strategy: str, dims: Any, *, said: str) -> None:
    """``StrategyError`` when ``cpu_offload`` (named ``said``: ``--cpu-offload``, ``CONVOY_CPU_OFFLOAD=1``) is
    asked of a strategy that keeps no FSDP2 shards to offload (single, dp, ddp, zero1), and of ``auto``, which
    decides offloading itself. ``dims``: the degrees beside it (for the message)."""
    from convoy.errors import StrategyError

    if strategy in OFFLOADING:
        return
    if strategy == "auto":
        raise StrategyError(f"{said} with strategy 'auto': auto offloads where nothing else fits and says so; name "
                            f"the strategy to offload (zero3, zero2, hsdp)")
    if strategy in BUILTIN_STRATEGIES:
        beside = f" (beside {dims.describe()})" if dims is not None else ""
        raise StrategyError(f"{said} offloads FSDP2's shards to host memory, and strategy {strategy!r}{beside} keeps "
                            f"none; use strategy 'zero3', 'zero2' or 'hsdp'")


def _bad(where: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{where}: {shown(value)} is not valid; expected {expected}")


def _to_str(value: Any, where: str, expected: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _bad(where, value, expected)
    if isinstance(value, int) and value.bit_length() > 40:
        raise _bad(where, value, expected)
    if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value.strip()):
        raise _bad(where, value, expected + ", without control characters")
    return str(value).strip()


def _parse_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(where, value, "true or false")


def is_whole(value: Any, minimum: int = 0) -> bool:
    """True for a whole number of Python's or numpy's (not a bool, not a float) >= ``minimum``: what a count
    argument of the Python API takes (``parse_whole`` reads one from a flag, a variable or a file)."""
    import numbers

    # typeshed's numbers.Integral declares no comparison with int; every Integral has one
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum  # type: ignore[operator]


def parse_whole(value: Any, where: str, minimum: int = 0) -> int:
    """A whole number >= ``minimum`` in ASCII digits (``int()`` would read '٣'), at most 12 of them."""
    expected = f"a whole number >= {minimum}"
    if isinstance(value, bool):
        raise _bad(where, value, expected)
    number = int(value) if isinstance(value, str) and _WHOLE.fullmatch(value) else value
    if not isinstance(number, int) or number < minimum or number.bit_length() > 40:
        raise _bad(where, value, expected)
    return number


#: the longest timeout taken (about 116 days): torch keeps timeouts in int64 milliseconds and a timedelta overflows
#: long before a float does, so 1e20 would pass as "finite" and then kill every rank
MAX_SECONDS = 10**7
MIN_SECONDS = 0.001  # torch counts collective timeouts in milliseconds: less is a timeout of 0


def _parse_seconds(value: Any, where: str) -> float:
    expected = f"a number of seconds > 0 (at least {MIN_SECONDS}) and at most {MAX_SECONDS} (e.g. 300)"
    if isinstance(value, bool):
        raise _bad(where, value, expected)
    number = value
    if isinstance(value, str):
        if not _SECONDS.fullmatch(value):  # ASCII only: float() would read '٣' and 'inf'
            raise _bad(where, value, expected)
        number = float(value)
    if isinstance(number, int) and number.bit_length() > 64:
        raise _bad(where, value, expected)
    if not isinstance(number, (int, float)) or not math.isfinite(number) or not MIN_SECONDS <= number <= MAX_SECONDS:
        raise _bad(where, value, expected)
    return float(number)


def _parse_norm(value: Any, where: str) -> float | None:
    """A DeepSpeed-style ``gradient_clipping``: the largest global gradient norm, a number > 0; 0 is no clipping."""
    expected = "the largest global gradient norm, a number >= 0 (0: no clipping)"
    if isinstance(value, bool):
        raise _bad(where, value, expected)
    number = value
    if isinstance(value, str):
        if not _SECONDS.fullmatch(value):  # ASCII only: float() would read 'inf'
            raise _bad(where, value, expected)
        number = float(value)
    if not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0:
        raise _bad(where, value, expected)
    return float(number) or None


def _parse_devices(value: Any, where: str) -> str:
    """A device request in ``convoy.parse_devices``'s grammar, normalised to its string form.

    What the request says is checked by the devices layer's own grammar (``convoy.devices.spec.check_devices``):
    everything ``convoy launch`` refuses on every machine ('0,0', '3-1', 'all,1') is refused here, so
    ``convoy config`` cannot write it. Whether the indices exist depends on the machine, which
    ``parse_devices`` checks when a job is launched.
    """
    from convoy.devices.spec import check_devices  # torch-free, and the grammar's one home
    from convoy.errors import DeviceSpecError

    expected = "a device request: 'auto', 'all', a count like 2, or indices like '0,2' or '0-3'"
    if isinstance(value, list):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**12 for v in value):
            raise _bad(where, value, "a non-empty list of device indices like [0, 2]")
        text = ",".join(str(v) for v in value) + ("," if len(value) == 1 else "")
    else:
        text = _to_str(value, where, expected)
        if not text:
            raise _bad(where, value, expected)
    try:
        check_devices(text)  # as the flag reads it: '1 2' is no request (removing the space made it a count of 12)
    except DeviceSpecError as err:
        reason = str(err).partition(": ")[2] or str(err)
        raise ConfigError(f"{where}: {shown(value)} is not valid: {reason}") from None
    return ",".join(part.strip() for part in text.split(","))


def _parse_parallelism(value: Any, where: str) -> str:
    from convoy.plan.dims import ParallelDims  # torch-free

    text = _to_str(value, where, "degrees like 'dp=2,tp=2,pp=1'")
    try:
        ParallelDims.parse(text)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return text


@dataclass(frozen=True, kw_only=True)
class Key:
    """One setting: how it is spelled, typed, defaulted and explained."""

    name: str
    """The TOML key (``mixed_precision``); ``--mixed-precision`` and ``CONVOY_MIXED_PRECISION`` derive from it."""
    type: str
    """What values look like, for ``convoy config keys`` (``"bool"``, ``"int >= 1"``, ``"one of ..."``)."""
    default: Any
    """The value when no flag, variable or file sets it (``None``: unset, the component decides)."""
    doc: str
    """One sentence: what the setting changes."""
    convert: Callable[[Any, str], Any]
    """``convert(raw, where) -> value``; raises ``ConfigError`` naming ``where`` on a wrong value."""
    choices: tuple[str, ...] = ()
    """Allowed values for a choice setting (shown in questions and errors)."""
    ask: bool = False
    """Whether the interactive ``convoy config`` asks for it."""

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, raw: Any, *, where: str, typed: bool = False) -> Any:
        """Convert ``raw`` (a TOML value or a string) to this key's type, or raise ``ConfigError``.

        ``typed``: ``raw`` comes from where values have types (a TOML file, a Python argument), not from text (a
        flag, a variable): a number or a yes/no written as a string there (``nproc_per_node = "2"``,
        ``free = "true"``, ``gradient_accumulation_steps=' 4 '``) is refused like any other wrong type."""
        if typed and isinstance(raw, str):
            _refuse_quoted(self, raw, where)
        return self.convert(raw, where)


def _refuse_quoted(key: Key, raw: str, where: str) -> None:
    """A number or a yes/no quoted where a typed source must give it unquoted (see ``Key.parse``); any other
    string is left to the key's parser, which says what it expects."""
    text = raw.strip()
    if key.type == "bool" and text.lower() in _TRUE | _FALSE:
        word = "true" if text.lower() in _TRUE else "false"
        raise ConfigError(f"{where}: {shown(raw)} is a string, not a bool; write {word} without quotes")
    numeric = key.type.startswith(("int", "seconds")) or key.name == "nproc_per_node"
    if numeric and _SECONDS.fullmatch(text):
        raise ConfigError(f"{where}: {shown(raw)} is a string, not a number; write {text} without quotes")


def _choice(*choices: str) -> Callable[[Any, str], str]:
    def convert(value: Any, where: str) -> str:
        text = value.strip().lower() if isinstance(value, str) else None
        if text not in choices:
            close = difflib.get_close_matches(text, choices, n=1) if text else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: {shown(value)} is not valid; expected one of {', '.join(choices)}{hint}")
        return text

    return convert


def _name(value: Any, where: str) -> str:
    text = _to_str(value, where, "a strategy name like 'ddp' or 'fsdp'")
    if not _NAME.match(text):
        raise _bad(where, value, "a strategy name like 'auto', 'ddp', 'zero1', 'zero2', 'zero3', 'fsdp'")
    return text.lower()


def _nnodes(value: Any, where: str) -> str:
    text = _to_str(value, where, "a node count like 2, or a range MIN:MAX like '1:4'")
    if not _NNODES.match(text) or any(int(p) < 1 for p in text.split(":")):
        raise _bad(where, value, "a node count like 2, or a range MIN:MAX like '1:4'")
    low, _, high = text.partition(":")
    if high and int(high) < int(low):
        raise _bad(where, value, f"a range MIN:MAX with MIN <= MAX, like '{high}:{low}'")
    return text


#: torchrun's --nproc-per-node words for one process per accelerator
ACCELERATOR_WORDS = ("gpu", "xpu", "cuda")
#: the words --nproc-per-node takes besides a number (auto: one per selected device; cpu: one per core)
NPROC_WORDS = ("auto", "cpu", *ACCELERATOR_WORDS)


def _nproc(value: Any, where: str) -> str:
    expected = "'auto' (one per selected device), torchrun's 'cpu' or 'gpu', or a whole number >= 1"
    text = _to_str(value, where, expected).strip().lower()
    if text not in NPROC_WORDS and not (re.fullmatch(r"[0-9]{1,12}", text) and int(text) >= 1):
        raise _bad(where, value, expected)
    return text


_HOST_NAME = r"[^\s:]+"  # a name or an IPv4 address
_IPV6 = r"[0-9a-fA-F:]+"


def is_host(text: str) -> bool:
    """``text`` is a host name or an IP address (IPv6 with or without brackets): ``--master-addr``'s and
    ``--local-addr``'s grammar, the host part of ``rdzv_endpoint``'s."""
    return bool(re.fullmatch(rf"{_HOST_NAME}|\[?{_IPV6}\]?", text))


def _endpoint(value: Any, where: str) -> str:
    expected = "HOST:PORT, e.g. 'node0:29500' (or '' for this machine)"
    text = _to_str(value, where, expected)
    if text and not re.fullmatch(rf"{_HOST_NAME}(:[0-9]{{1,5}})?|\[{_IPV6}\](:[0-9]{{1,5}})?", text):
        raise _bad(where, value, expected)
    port = text.rpartition(":")[2] if re.search(r":[0-9]{1,5}$", text) else ""
    if not text.isascii() or (port and not 0 < int(port) <= 65535):
        raise _bad(where, value, expected + " with an ASCII host and a port from 1 to 65535")
    return text


def _backend(value: Any, where: str) -> str:
    """A torch.compile backend name, lower case as torch spells them (Accelerate writes ``INDUCTOR``)."""
    text = _to_str(value, where, "a torch.compile backend name like 'inductor' or 'aot_eager'")
    if not _NAME.match(text):
        raise _bad(where, value, "a torch.compile backend name like 'inductor' or 'aot_eager'")
    return text.lower()


def _text(value: Any, where: str) -> str:
    return _to_str(value, where, "a string")


SCHEMA: tuple[Key, ...] = (
    Key(name="devices", type="device request", default="auto", ask=True, convert=_parse_devices,
        doc="Which accelerators a job uses: 'auto' (all visible), a count (2), or indices in order ('1,0')."),
    Key(name="free", type="bool", default=False, ask=True, convert=_parse_bool,
        doc="Only pick devices that no other process is using."),
    Key(name="strategy", type="name", default="auto", ask=True, convert=_name,
        doc="How the model is spread over processes: " + ", ".join(BUILTIN_STRATEGIES) + "."),
    Key(name="mixed_precision", type="one of " + ", ".join(MIXED_PRECISIONS), default="no", ask=True,
        convert=_choice(*MIXED_PRECISIONS), choices=MIXED_PRECISIONS,
        doc="Lower-precision compute: 'no' (fp32), 'fp16' (with loss scaling), 'bf16', or 'fp8' (torchao's float8 "
            "linears under bf16 autocast; pip install 'convoy[fp8]')."),
    Key(name="fp8_recipe", type="one of " + ", ".join(FP8_RECIPES), default=None, convert=_choice(*FP8_RECIPES),
        choices=FP8_RECIPES,
        doc="How mixed_precision 'fp8' scales (unset: tensorwise, with FSDP2 gathering weights in float8)."),
    Key(name="fp8_emulate", type="bool", default=False, convert=_parse_bool,
        doc="Run mixed_precision 'fp8' on a board without float8 tensor cores (CPU, A100) in torchao's emulation: "
            "for tests, not for speed."),
    Key(name="recompute", type="one of " + ", ".join(RECOMPUTE_MODES), default="none",
        convert=_choice(*RECOMPUTE_MODES), choices=RECOMPUTE_MODES,
        doc="Activation recomputation: 'none'; 'selective' keeps each block's matmul and attention outputs and "
            "recomputes the rest in the backward; 'full' keeps each block's input only and recomputes the block."),
    Key(name="compile", type="one of " + ", ".join(COMPILE_SCOPES), default="none",
        convert=_choice(*COMPILE_SCOPES), choices=COMPILE_SCOPES,
        doc="torch.compile: 'none'; 'blocks' compiles each repeated block in place (fullgraph, after tensor "
            "parallelism and recompute, before data parallelism); 'model' compiles the whole model."),
    Key(name="compile_backend", type="name", default="inductor", convert=_backend,
        doc="The torch.compile backend with compile (inductor; others, such as aot_eager, pass through)."),
    Key(name="compile_mode", type="one of " + ", ".join(COMPILE_MODES), default=None,
        convert=_choice(*COMPILE_MODES), choices=COMPILE_MODES,
        doc="The torch.compile mode with compile (unset: torch's default)."),
    Key(name="compile_dynamic", type="bool", default=None, convert=_parse_bool,
        doc="torch.compile(dynamic=...) with compile: true compiles for changing shapes up front (unset: torch "
            "recompiles once a shape changes)."),
    Key(name="parallelism", type="degrees", default=None, convert=_parse_parallelism,
        doc="Parallel degrees like 'dp=2,tp=2,pp=1' (unset: all data parallel)."),
    Key(name="cpu_offload", type="bool", default=False, convert=_parse_bool,
        doc="Keep sharded weights, gradients and optimizer state in host memory (FSDP2's CPUOffloadPolicy; "
            "zero2, zero3, fsdp, hsdp, parallel)."),
    Key(name="pp_schedule", type="one of " + ", ".join(PP_SCHEDULES), default=None, convert=_choice(*PP_SCHEDULES),
        choices=PP_SCHEDULES, doc="The pipeline schedule when pp > 1 (unset: 1f1b)."),
    Key(name="pp_stages_per_rank", type="int >= 1", default=None, convert=lambda v, w: parse_whole(v, w, 1),
        doc="Pipeline stages each process holds under interleaved_1f1b or looped_bfs (unset: 2)."),
    Key(name="pp_microbatches", type="int >= 1", default=None, convert=lambda v, w: parse_whole(v, w, 1),
        doc="Micro-batches a pipeline cuts each batch into (unset: one per stage); the plan's count."),
    Key(name="gradient_accumulation_steps", type="int >= 1", default=1, ask=True,
        convert=lambda v, w: parse_whole(v, w, 1),
        doc="Micro-batches whose gradients are summed before each optimizer step."),
    Key(name="gradient_clipping", type="number >= 0", default=None, convert=_parse_norm,
        doc="The global gradient norm clipped to before each optimizer step, as DeepSpeed's gradient_clipping "
            "(unset or 0: no clipping)."),
    Key(name="collective_timeout", type="seconds > 0", default=DEFAULT_COLLECTIVE_TIMEOUT, convert=_parse_seconds,
        doc="Seconds a collective may wait for the other ranks before the job ends with their names."),
    Key(name="nnodes", type="count or MIN:MAX", default="1", ask=True, convert=_nnodes,
        doc="Machines in the job: a count, or MIN:MAX for an elastic job."),
    Key(name="nproc_per_node", type="'auto', 'cpu', 'gpu' or int >= 1", default="auto", convert=_nproc,
        doc="Processes per machine: 'auto' starts one per selected device; on a machine without one, 2 CPU "
            "processes when nothing sets it, one per CPU core when 'auto' is given (torchrun's 'auto'); 'gpu' one "
            "per device; 'cpu' one per core; or a number."),
    Key(name="rdzv_backend", type="one of c10d, static", default="c10d", convert=_choice("c10d", "static"),
        choices=("c10d", "static"), doc="How the machines find each other (torchrun's --rdzv-backend)."),
    Key(name="rdzv_endpoint", type="HOST:PORT", default="", ask=True, convert=_endpoint,
        doc="Where the machines meet: the first node's address and a free port ('' on one machine)."),
    Key(name="rdzv_id", type="string", default="", convert=_text,
        doc="A job id shared by every machine of one job (torchrun's --rdzv-id)."),
    Key(name="max_restarts", type="int >= 0", default=0, ask=True, convert=lambda v, w: parse_whole(v, w, 0),
        doc="How many times the whole group restarts after a process fails (resume with load_state())."),
    Key(name="log_level", type="one of " + ", ".join(LOG_LEVELS), default="info", convert=_choice(*LOG_LEVELS),
        choices=LOG_LEVELS,
        doc="Level of convoy's own log messages (convoy.train.logging.get_logger)."),
)

KEYS: dict[str, Key] = {key.name: key for key in SCHEMA}


def closest_key(name: str) -> str | None:
    """The known key nearest to a misspelt ``name`` (``mixed_precison`` -> ``mixed_precision``), if any."""
    normal = name.strip().lower().replace("-", "_")
    if normal in KEYS:
        return normal
    close = difflib.get_close_matches(normal, KEYS, n=1, cutoff=0.6)
    return close[0] if close else None


def key_for(name: str, *, where: str = "setting") -> Key:
    """The ``Key`` called ``name``; ``ConfigError`` with the closest key's name otherwise."""
    key = KEYS.get(name)
    if key is None:
        close = closest_key(name)
        hint = f" (did you mean '{close}'?)" if close else f"; known keys: {', '.join(KEYS)}"
        raise ConfigError(f"{where}: unknown key '{name}'{hint}")
    return key

"""float8 training: each big ``nn.Linear`` swapped for torchao's ``Float8Linear``, the first step of a layout.

    accelerator = Accelerator(mixed_precision="fp8", fp8_recipe="tensorwise", strategy="zero3")
    $ convoy launch --mixed-precision fp8 --fp8-recipe rowwise train.py

    float8 = Float8Training(recipe="tensorwise")
    converted = apply_float8(model, float8, fsdp=True)      # before TP, recompute, compile and FSDP2
    ...; optimizer.step(); precompute_scales(model)          # tensorwise + FSDP2's float8 all-gather

torchtitan's order (``models/llama3/parallelize.py``): float8 conversion, tensor parallel, activation
checkpointing, compile, FSDP2. torchao does the work (``convert_to_float8_training``, ``Float8LinearConfig
.from_recipe_name``); this module picks the layers and the config:

- which layers: every ``nn.Linear`` whose in and out features are multiples of 16 (``torch._scaled_mm``'s
  requirement), except the output head (the model's last ``nn.Linear``, ``lm_head`` / ``get_output_embeddings()``,
  and any whose weight is tied to an embedding); a user's filter (Accelerate's ``module_filter_func(module, fqn) ->
  bool``, True: convert) narrows that further. Accelerate's own default also skips the *first* linear; torchtitan
  converts it, as convoy does.
- the recipe: ``tensorwise`` (the default; under FSDP2 the weights are all-gathered in float8,
  ``enable_fsdp_float8_all_gather``, and their scales computed in one all-reduce after each optimizer step,
  ``precompute_float8_dynamic_scale_for_fsdp``), ``rowwise`` and ``rowwise_with_gw_hp`` (all-gathered in bf16).
- the board: float8 tensor cores exist on NVIDIA compute capability 8.9 and later (L4, L40S, H100, H200, B200) and
  AMD MI300; elsewhere (A100, CPU) fp8 only costs time, so it is refused unless ``fp8_emulate`` asks for torchao's
  emulation (tests). ``torch._scaled_mm`` itself runs on CPU in torch 2.13 (``Float8Training(emulate=False)``).

torchao is an optional extra (``pip install 'convoy[fp8]'``), imported here only when fp8 is used. The model keeps
high-precision weights (``Float8Linear.weight``): state dicts and checkpoints are the bf16/fp32 model's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from convoy.config.schema import FP8_RECIPES
from convoy.errors import ConfigError, NotSupportedYetError, shown

__all__ = ["Float8Training", "float8_for", "apply_float8", "float8_filter", "float8_config", "precompute_scales",
           "needs_precompute", "has_float8_tensor_cores", "check_float8_board", "import_torchao",
           "float8_tp_styles", "refuse_float8_tp", "is_float8_linear", "tracing_stand_ins", "FP8_MULTIPLE",
           "MISSING_TORCHAO"]

#: ``torch._scaled_mm`` needs both GEMM dimensions divisible by 16
FP8_MULTIPLE = 16
#: the line a run with fp8 and without torchao ends with
MISSING_TORCHAO = "mixed_precision='fp8' needs torchao: pip install 'convoy[fp8]'"
#: the compute capability of NVIDIA's first float8 tensor cores (Ada, sm_89; Hopper is 9.0)
_SM_FLOAT8 = (8, 9)
#: AMD's architectures with float8 matrix cores (MI300, MI325X: gfx942; MI355X: gfx950)
_AMD_FLOAT8 = ("gfx942", "gfx950")


@dataclass(frozen=True, kw_only=True)
class Float8Training:
    """What ``mixed_precision="fp8"`` converts and how (the ``Accelerator``'s ``fp8_recipe``, ``fp8_emulate`` and
    ``AORecipeKwargs``)."""

    recipe: str = "tensorwise"
    """torchao's recipe name: ``"tensorwise"``, ``"rowwise"`` or ``"rowwise_with_gw_hp"``."""
    emulate: bool = False
    """torchao's ``emulate``: the float8 GEMMs emulated in high precision instead of ``torch._scaled_mm``."""
    config: Any = None
    """A ``torchao.float8.Float8LinearConfig`` given whole (``AORecipeKwargs(config=...)``): used instead of the
    recipe's, with ``emulate`` set as above."""
    module_filter: Callable[[nn.Module, str], bool] | None = None
    """The user's filter, ``(module, fqn) -> bool`` (True: convert), applied after convoy's own."""
    fsdp_float8_all_gather: bool | None = None
    """FSDP2 gathers the weights in float8 (tensorwise only); None: yes under FSDP2 with tensorwise scaling."""
    pad_inner_dim: bool | None = None
    """torchao's ``pad_inner_dim``; None: the config's (off)."""

    def __post_init__(self) -> None:
        if self.recipe not in FP8_RECIPES:
            raise ConfigError(f"fp8_recipe={shown(self.recipe)} is not a float8 recipe; choose one of "
                              f"{', '.join(FP8_RECIPES)}")
        if self.module_filter is not None and not callable(self.module_filter):
            raise ConfigError(f"module_filter_func={shown(self.module_filter)}: give a function (module, fqn) -> bool")

    @property
    def tensorwise(self) -> bool:
        """True when weights are scaled per tensor (what FSDP2's float8 all-gather and float8 TP need)."""
        if self.config is not None:
            from torchao.float8.config import ScalingGranularity

            return bool(self.config.cast_config_weight.scaling_granularity is ScalingGranularity.TENSORWISE)
        return self.recipe == "tensorwise"


def _broken_torchao(err: ImportError) -> str:
    """The line for a torchao that is installed but fails to import (built for another torch, a missing piece)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = f"torchao {version('torchao')}"
    except PackageNotFoundError:
        installed = "torchao"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"mixed_precision='fp8': {installed} is installed but cannot be imported with torch {torch.__version__} "
            f"({first}); install the torchao release made for this torch (convoy[fp8] pins torchao 0.18.0, "
            f"for torch 2.11 to 2.13)")


def import_torchao() -> Any:
    """``torchao.float8``; ``NotSupportedYetError`` with the install line when torchao is missing. What its import
    logs about itself (CUDA kernels a CPU build cannot load; torch 2.13's deprecation of its pytree registration of
    an enum) is kept out of the log."""
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    except ImportError as err:  # missing, or installed but built for another torch
        missing = isinstance(err, ModuleNotFoundError) and err.name == "torchao"
        raise NotSupportedYetError(MISSING_TORCHAO if missing else _broken_torchao(err)) from None
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    return float8


def has_float8_tensor_cores(device: torch.device | str) -> bool:
    """Whether ``device`` multiplies float8 in hardware (NVIDIA sm_89+, AMD gfx942/gfx950); False for the CPU."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        return any(arch.startswith(name) for name in _AMD_FLOAT8)
    return torch.cuda.get_device_capability(device) >= _SM_FLOAT8


def check_float8_board(device: torch.device | str, *, emulate: bool) -> None:
    """``NotSupportedYetError`` naming the board when ``device`` has no float8 tensor cores and emulation was not
    asked for (``Accelerator(fp8_emulate=True)``, ``CONVOY_FP8_EMULATE=1``)."""
    if emulate or has_float8_tensor_cores(device):
        return
    device = torch.device(device)
    board = torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else "the CPU"
    raise NotSupportedYetError(
        f"mixed_precision='fp8': {board} has no float8 tensor cores (NVIDIA compute capability 8.9+: L40S, H100, "
        f"H200, B200; AMD MI300), so fp8 would only be slower than bf16; use mixed_precision='bf16', or set "
        f"CONVOY_FP8_EMULATE=1 / Accelerator(fp8_emulate=True) to run it emulated (tests)")


def float8_config(float8: Float8Training, *, fsdp: bool) -> Any:
    """torchao's ``Float8LinearConfig`` for ``float8``; ``fsdp``: the model will be sharded by FSDP2, whose
    all-gather then moves tensorwise weights in float8 (torchtitan's and Accelerate's default)."""
    ao = import_torchao()
    config = float8.config if float8.config is not None else ao.Float8LinearConfig.from_recipe_name(float8.recipe)
    wanted = float8.fsdp_float8_all_gather
    if wanted is None:
        wanted = config.enable_fsdp_float8_all_gather if float8.config is not None else True
    changes: dict[str, Any] = {"emulate": float8.emulate,
                               "enable_fsdp_float8_all_gather": bool(fsdp and wanted and float8.tensorwise)}
    if float8.pad_inner_dim is not None:
        changes["pad_inner_dim"] = float8.pad_inner_dim
    return dataclasses.replace(config, **changes)


def float8_for(settings: Any, handler: Any = None, *, check_board: bool = True) -> Float8Training | None:
    """What fp8 converts for a run's ``TrainSettings`` (``fp8_recipe``, ``fp8_emulate``) and its ``AORecipeKwargs``
    (``handler``); None when the run is not fp8. ``check_board``: refuse a board without float8 tensor cores
    unless ``fp8_emulate`` (``check_float8_board``)."""
    if settings.mixed_precision != "fp8":
        return None
    import_torchao()
    if check_board:
        device = torch.device("cpu") if settings.device_type == "cpu" else \
            torch.device(settings.device_type, settings.local_rank)
        check_float8_board(device, emulate=settings.fp8_emulate)
    emulate = settings.fp8_emulate and not has_float8_tensor_cores(
        "cpu" if settings.device_type == "cpu" else f"{settings.device_type}:{settings.local_rank}")
    given = handler.to_kwargs() if handler is not None else {}
    return Float8Training(recipe=settings.fp8_recipe, emulate=emulate, config=given.get("config"),
                          module_filter=given.get("module_filter_func"),
                          fsdp_float8_all_gather=given.get("enable_fsdp_float8_all_gather"),
                          pad_inner_dim=given.get("pad_inner_dim"))


def _head_names(model: nn.Module) -> set[str]:
    """The output head: the model's last ``nn.Linear``, one called ``lm_head`` or that transformers'
    ``get_output_embeddings()`` returns, and every linear whose weight an embedding shares."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    output = getattr(model, "get_output_embeddings", None)
    declared = output() if callable(output) else None
    heads = {name for name, m in linears
             if id(m.weight) in embedded or name.rpartition(".")[2] == "lm_head" or m is declared}
    if linears:
        heads.add(linears[-1][0])
    return heads


def float8_filter(model: nn.Module, user: Callable[[nn.Module, str], bool] | None = None
                  ) -> Callable[[nn.Module, str], bool]:
    """The ``(module, fqn) -> bool`` that says which of ``model``'s linears become ``Float8Linear``: dims multiples
    of 16, not the output head, and ``user``'s filter where given."""
    heads = _head_names(model)

    def convert(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or fqn in heads:
            return False
        if module.in_features % FP8_MULTIPLE or module.out_features % FP8_MULTIPLE:
            return False
        return bool(user(module, fqn)) if user is not None else True

    return convert


def is_float8_linear(module: nn.Module) -> bool:
    """Whether ``module`` is torchao's ``Float8Linear`` (without importing torchao for a model that has none)."""
    return type(module).__name__ == "Float8Linear" and type(module).__module__.startswith("torchao.")


def apply_float8(model: nn.Module, float8: Float8Training | None, *, fsdp: bool = False) -> list[str]:
    """Swap ``model``'s linears (``float8_filter``) for ``Float8Linear`` in place; the names converted (none when
    ``float8`` is None: not fp8). ``fsdp``: FSDP2 will shard the model (tensorwise weights are gathered in float8).
    Call it first, before tensor parallel, recompute, compile and FSDP2."""
    if float8 is None:
        return []
    ao = import_torchao()
    keep = float8_filter(model, float8.module_filter)
    wanted = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and keep(m, name)]
    if not wanted:
        return []
    ao.convert_to_float8_training(model, module_filter_fn=keep, config=float8_config(float8, fsdp=fsdp))
    converted = [(name, m) for name, m in model.named_modules() if is_float8_linear(m)]
    for _, module in converted:
        module.register_forward_pre_hook(_cpu_autocast_input)
    return [name for name, _ in converted]


def _cpu_autocast_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A ``Float8Linear``'s input in the CPU's autocast dtype: torchao casts it under CUDA's autocast only
    (``float8_linear.py``: "hardcode to GPU's autocast dtype"), and ``rowwise_with_gw_hp``'s bf16 weight-gradient GEMM
    then meets an fp32 input on the CPU."""
    if args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu" and \
            torch.is_autocast_enabled("cpu") and args[0].is_floating_point():
        return (args[0].to(torch.get_autocast_dtype("cpu")), *args[1:])
    return None


def tracing_stand_ins(model: nn.Module, others: Callable[[], Mapping[str, nn.Module]] | None = None
                      ) -> dict[str, nn.Module]:
    """Plain ``nn.Linear`` stand-ins, by name, for each of ``model``'s ``Float8Linear`` while a pipeline traces it
    (``PipelineModule(trace_stand_ins=)``): each stage then calls the real ``Float8Linear`` by name, with its float8
    weight (what FSDP2's float8 all-gather needs) rather than a graph torch.export made of it. ``others``' stand-ins
    (tensor parallel's) win where both name a module. Weights are left uninitialised: only shapes are traced."""
    stand_ins: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if is_float8_linear(module):
            linear = cast(nn.Linear, module)
            weight = linear.weight
            stand_ins[name] = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                        device=weight.device, dtype=weight.dtype)
    if others is not None:
        stand_ins.update(others())
    return stand_ins


def needs_precompute(model: nn.Module) -> bool:
    """Whether ``model`` holds float8 linears whose weights FSDP2 gathers in float8: their scales are computed once
    after each optimizer step (``precompute_scales``), not inside every forward."""
    return any(is_float8_linear(m) and cast(Any, m).config.enable_fsdp_float8_all_gather for m in model.modules())


def precompute_scales(model: nn.Module) -> None:
    """torchao's ``precompute_float8_dynamic_scale_for_fsdp``: one all-reduce for every float8 weight's amax,
    after the optimizer step (a no-op for a model without FSDP2 float8 weights)."""
    import_torchao().precompute_float8_dynamic_scale_for_fsdp(model)


def refuse_float8_tp(float8: Float8Training | None, *, backend: str | None, device_type: str) -> None:
    """``NotSupportedYetError`` for float8 with tensor parallel on gloo (a CPU job): gloo cannot all-gather float8
    tensors (``RuntimeError: Invalid scalar type``)."""
    if float8 is None:
        return
    if device_type == "cpu" or (backend or "").split(":")[-1] == "gloo":
        raise NotSupportedYetError("mixed_precision='fp8' with tensor parallel (tp > 1) runs on GPUs only: gloo cannot "
                                   "all-gather float8 tensors ('Invalid scalar type'); use tp=1 or bf16 on CPU")


def float8_tp_styles(module: nn.Module) -> tuple[type, type] | None:
    """torchao's (``Float8ColwiseParallel``, ``Float8RowwiseParallel``) for a tensorwise ``Float8Linear``, whose
    activations then cross the tp group in float8; None for any other module (torch's styles, bf16 traffic, as
    rowwise recipes have in torchtitan)."""
    if not is_float8_linear(module):
        return None
    from torchao.float8.config import ScalingGranularity

    if module.config.cast_config_input.scaling_granularity is not ScalingGranularity.TENSORWISE:  # type: ignore[union-attr]
        return None
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    return Float8ColwiseParallel, Float8RowwiseParallel

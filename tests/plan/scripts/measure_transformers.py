"""A benchmark model built by transformers, at full size, one training step on the CPU with nothing allocated:
MemTracker's categories at the peak, with CUDA autocast's op lists applied, to compare with the planner.

    OMP_NUM_THREADS=1 python tests/plan/scripts/measure_transformers.py pythia-410m 2048 4
    OMP_NUM_THREADS=1 python tests/plan/scripts/measure_transformers.py llama-1.1b-gqa 4096 4 recompute
    ... qwen2-0.5b 4096 1 fsdp          # bf16 weights, as FSDP2's MixedPrecisionPolicy gathers them
    ... llama-1.1b-gqa 4096 4 recompute cache   # keep transformers' KV cache (use_cache=True)

Needs transformers (not a dependency of convoy: ``pip install transformers`` beside it). The model is built under
``FakeTensorMode`` (benchmarks/planner_models.py's configs), and a ``TorchFunctionMode`` applies what
``torch.autocast("cuda", dtype=torch.bfloat16)`` does, above autograd as autocast does: matmuls and SDPA take
bf16 casts (a weight's cast made once per forward), the ops on CUDA's fp32 list (PyTorch, "Autocast Op
Reference") run in fp32, dropout saves CUDA's bool mask and SDPA keeps no dropout mask (CUDA's flash kernel).
Checkpointed blocks re-enter the emulation when they are recomputed, as autocast does. What a GPU adds beyond
the graph (kernel workspaces, the allocator) is not here: that is what telling the two apart is for.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from planner_models import CONFIGS  # noqa: E402

LOWER = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "scaled_dot_product_attention",
         "conv1d", "conv2d", "__matmul__", "__rmatmul__", "mv", "addmv"}
FP32 = {"layer_norm", "softmax", "log_softmax", "pow", "__pow__", "__rpow__", "rsqrt", "exp", "log", "sum",
        "cross_entropy", "nll_loss", "group_norm", "mse_loss", "logsumexp", "cumsum", "prod", "softplus",
        "reciprocal", "norm", "log1p", "expm1", "acos", "asin", "cosh", "sinh", "tan", "erfinv"}


class CudaAutocast(TorchFunctionMode):
    """``torch.autocast("cuda", bfloat16)``'s casts on any device; ``cache_weights=False`` inside a recompute."""

    def __init__(self, *, cache_weights: bool = True) -> None:
        super().__init__()
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.cache_weights = cache_weights

    def _cast(self, x, dtype):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            if x.is_leaf and x.requires_grad and self.cache_weights:
                if id(x) not in self.cache:
                    self.cache[id(x)] = (x, x.to(dtype))
                return self.cache[id(x)][1]
            return x.to(dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(y, dtype) for y in x)
        return x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "dropout":  # CUDA's fused dropout keeps a bool mask (CPU's keeps a noise tensor)
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            return torch.native_dropout(args[0], p, True)[0] if training and 0 < p < 1 else args[0]
        if name == "scaled_dot_product_attention":  # CUDA's flash kernel takes dropout and keeps no mask
            kwargs["dropout_p"] = 0.0
            args = args[:4] + ((0.0,) + args[5:] if len(args) > 4 else ())
        dtype = torch.bfloat16 if name in LOWER else torch.float32 if name in FP32 else None
        if dtype is not None:
            args = tuple(self._cast(a, dtype) for a in args)
            kwargs = {k: self._cast(v, dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def one_step(name: str, seq: int, batch: int, *, bf16_weights: bool, recompute: bool, cache: bool) -> dict:
    """MemTracker's categories (bytes) at the peak of the second of two training steps."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoConfig, AutoModelForCausalLM

    config = CONFIGS[name]
    with FakeTensorMode():
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), attn_implementation="sdpa",
                                                 **({"dtype": torch.bfloat16} if bf16_weights else {}))
        if recompute:
            from torch.utils.checkpoint import checkpoint

            def under_autocast(forward):
                def run(*a, **k):
                    with CudaAutocast(cache_weights=False):
                        return forward(*a, **k)
                return run

            for block in next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList)):
                block.forward = functools.partial(checkpoint, under_autocast(block.forward), use_reentrant=False)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        ids = torch.randint(0, config["vocab_size"], (batch, seq))
        tracker = MemTracker()
        tracker.track_external(model, opt, ids)
        with tracker:
            for step in range(2):
                mode = CudaAutocast()
                with mode:
                    loss = model(input_ids=ids, labels=ids, use_cache=cache).loss
                    mode.cache.clear()  # autocast drops its casts when the forward's region ends
                    mode.cache_weights = False
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if step == 0:
                    tracker.reset_mod_stats()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    return {str(k).split(".")[-1].lower(): v for k, v in peak.items()}


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    name, seq, batch, *flags = argv
    got = one_step(name, int(seq), int(batch), bf16_weights="fsdp" in flags, recompute="recompute" in flags,
                   cache="cache" in flags)
    print(name, seq, "x", batch, " ".join(flags), {k: f"{v / 1e9:.3f} GB" for k, v in got.items() if v})


if __name__ == "__main__":
    main(sys.argv[1:])

"""Count the operators a training step runs, and measure what one costs on this CPU (``convoy.plan.speed.cpu_step``).

    from convoy.plan.speed.measure_cpu import OpCounter, cpu_rates, round_trip_seconds
    counter = OpCounter()
    with counter:                      # or counter.start() ... counter.stop(), from two hooks
        train_one_step()
    counter.ops                        # a StepOps
    rates = cpu_rates(processes=2)     # cached per CPU, torch version, threads, processes (~0.2 s when measured)
    collective, transfer, bandwidth = round_trip_seconds()             # every rank of the job, at once
    rates = replace(rates, collective_seconds=collective, transfer_seconds=transfer,
                    collective_bytes_per_s=bandwidth)

``OpCounter`` is a ``TorchDispatchMode``: it counts every operator the dispatcher runs on this thread (the CPU
autograd engine's too) and runs it unchanged; an operator on DTensors is counted once, before DTensor unwraps it.
``measure_cpu_rates`` times a small reference training step per counted operator, AdamW steps and a
forward-backward over DTensor parameters, a matmul and a copy. ``cpu_rates`` keeps them in the calibration cache and
reads them back only while a quick timing of the reference step (a few milliseconds) agrees with the cached cost per
operator within ``STALE_FACTOR``: rates measured while the machine was busy (two intra-op threads beside other work
can cost 50x per operator), or on a machine since changed, are measured again and replace the entry (for a job
without DTensors: a DeviceMesh's measurement runs collectives, so there the shared cache decides for every rank).
``round_trip_seconds`` is not cached: it depends on the job's processes and on what else the machine runs. The
measurements leave the job's random generator as they found it. torch is imported inside functions only.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from convoy.errors import PlanError
from convoy.plan.speed.cpu_step import CpuRates, StepOps, rates_key
from convoy.plan.speed.records import Calibration, load_calibration, save_calibration

__all__ = ["OpCounter", "measure_cpu_rates", "cpu_rates", "round_trip_seconds", "STALE_FACTOR"]

#: a cached cost per operator further than this from one timed now (either way) is measured again
STALE_FACTOR = 3.0

_F = TypeVar("_F", bound=Callable[..., Any])


def _keeps_random_state(fn: _F) -> _F:
    """``fn`` with the CPU random generator as it found it: the measurements build models and random tensors in the
    user's job, which must draw the same numbers with the report as without it (a resumed run's RNG state, dropout).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.random.fork_rng(devices=[]):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


_GEMMS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.")
_ATTENTION = "aten._scaled_dot_product"
_COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.", "c10d_functional.", "_dtensor.")
_TRANSFERS = ("c10d.send.", "c10d.recv_.", "c10d.recv_any_source_.")
_NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd")


def _counter_class() -> type:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def local(t: Any) -> Any:
        return getattr(t, "_local_tensor", t)

    def nbytes(t: Any) -> int:
        t = local(t)
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    class _Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = self.dtensor = self.foreach = self.collectives = self.transfers = 0
            self.flops = self.moved = self.collective_bytes = 0.0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            try:
                self._count(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 -- an operator the rules do not know still runs, uncounted
                pass
            return out

        def _count(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
            name = str(func)
            flat, _ = tree_flatten((args, kwargs))
            tensors = [a for a in flat if isinstance(a, torch.Tensor)]
            if name.startswith(_COLLECTIVE_PREFIXES) and not any(n in name for n in _NOT_COLLECTIVES):
                self.collectives += 1
                self.transfers += name.startswith(_TRANSFERS)
                self.collective_bytes += sum(nbytes(t) for t in tensors)
                return
            subclass = [t for t in tensors if type(t) not in (torch.Tensor, torch.nn.Parameter)]
            if subclass and "_foreach_" in name:
                lists = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, (list, tuple))]
                self.foreach += max((len(x) for x in lists), default=1)
            elif subclass:
                self.dtensor += 1
            else:
                self.ops += 1
            if name.startswith(_GEMMS):
                a, b = [local(t) for t in tensors if t.dim() >= 2][-2:]
                self.flops += 2 * a.numel() * b.shape[-1]
            elif name.startswith(_ATTENTION) and tensors:
                q, k = local(tensors[0]), local(tensors[1])  # (batch, heads, seq, dim)
                forward = 4 * q.numel() * k.shape[-2]
                self.flops += 2 * forward if "backward" in name else forward
            if not func.is_view:
                outs, _ = tree_flatten(out)
                self.moved += sum(nbytes(t) for t in (*tensors, *outs) if isinstance(t, torch.Tensor))

    return _Counter


class OpCounter:
    """Counts the operators run between ``start()`` and ``stop()`` on this thread (or inside ``with``)."""

    def __init__(self) -> None:
        self._mode: Any = None
        self._result: StepOps | None = None

    def start(self) -> None:
        if self._mode is None:
            self._mode = _counter_class()()
            self._mode.__enter__()

    def stop(self) -> StepOps:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
            self._result = StepOps(ops=mode.ops, dtensor_ops=mode.dtensor, dtensor_foreach=mode.foreach,
                                   gemm_flops=mode.flops,
                                   bytes_moved=mode.moved, collectives=mode.collectives,
                                   transfers=mode.transfers, collective_bytes=mode.collective_bytes)
        return self.ops

    @property
    def counting(self) -> bool:
        return self._mode is not None

    @property
    def ops(self) -> StepOps:
        if self._result is None:
            raise PlanError("no operators counted yet: start() and stop() the counter around a step")
        return self._result

    def __enter__(self) -> OpCounter:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _median_seconds(fn: Any, reps: int, inner: int = 1) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def _keep_matmuls(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """The reference step's selective policy: keep the matrix products' outputs, recompute the rest (the shape of
    the trainer's save list, ``convoy.train.parallel.recompute.SELECTIVE_SAVES``)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    kept = func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if kept else CheckpointPolicy.PREFER_RECOMPUTE


def _reference_step(recompute: str = "none") -> Any:
    """A small training step (module docstring): three Linear layers, ReLU, cross-entropy, backward, AdamW; with
    ``recompute`` "full" or "selective" the layers run under torch's non-reentrant checkpoint, as the trainer's
    blocks do (``convoy.train.parallel.recompute``)."""
    import torch
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)
    contexts: dict[str, Any] = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)} \
        if recompute == "selective" else {}

    def forward(inputs: Any) -> Any:
        if recompute == "none":
            return model(inputs)
        return checkpoint(model, inputs, use_reentrant=False, **contexts)

    def step() -> None:
        torch.nn.functional.cross_entropy(forward(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def _op_seconds(reps: int, recompute: str = "none") -> float:
    """Seconds per counted operator of the reference step (median of ``reps`` timings)."""
    step = _reference_step(recompute)
    step()
    with OpCounter() as counter:
        step()
    return _median_seconds(step, reps) / max(1, counter.ops.ops)


@_keeps_random_state
def _op_seconds_now() -> float:
    """A quick ``_op_seconds`` (5 timings, a few milliseconds), to check a cached cost against."""
    return _op_seconds(5)


def _current(cached: CpuRates) -> bool:
    """Whether ``cached`` still holds on this machine now: its cost per operator within ``STALE_FACTOR`` of a quick
    timing."""
    now = _op_seconds_now()
    return cached.op_seconds / STALE_FACTOR <= now <= cached.op_seconds * STALE_FACTOR


@_keeps_random_state
def measure_cpu_rates(*, mesh: Any = None, reps: int = 15) -> CpuRates:
    """Measure this process's rates on the CPU: the cost per operator is a small training step (three Linear
    layers, ReLU, cross-entropy, backward, AdamW, ``zero_grad``) timed and divided by the operators the counter
    counts in it, so the Python of modules, autograd and the optimizer is in it as in a user's step, and the same
    with its layers recomputed (full, and per-op selective keeping the matrix products' outputs); the DTensor
    costs are AdamW steps over DTensor parameters (per parameter, then ``foreach``) and a forward-backward
    through two sharded linears (the dearer per operator) on ``mesh``, a DeviceMesh of the job (without one they
    are 0); the matmul rate a 256 x 512 x 512 product, the bandwidth a 16 MiB copy. The
    collectives' round trip is not measured here (``round_trip_seconds``)."""
    import torch

    g = torch.Generator().manual_seed(0)
    op = _op_seconds(reps)
    checkpointed, selective = _op_seconds(reps, "full"), _op_seconds(reps, "selective")
    single = foreach = 0.0
    if mesh is not None:
        single, foreach = _dtensor_seconds(mesh, op, reps)
    a, b = torch.randn(256, 512, generator=g), torch.randn(512, 512, generator=g)
    gemm = 2 * 256 * 512 * 512 / _median_seconds(lambda: torch.mm(a, b), max(3, reps // 3))
    src = torch.empty(1 << 22)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / _median_seconds(lambda: dst.copy_(src), max(3, reps // 3))
    return CpuRates(op_seconds=op, checkpoint_op_seconds=checkpointed, selective_op_seconds=selective,
                    dtensor_op_seconds=single, dtensor_foreach_seconds=foreach,
                    gemm_flops_per_s=gemm, memory_bytes_per_s=bandwidth, threads=torch.get_num_threads(),
                    measured_at=time.time())


def _dtensor_seconds(mesh: Any, op: float, reps: int) -> tuple[float, float]:
    """(seconds per operator on DTensors, per DTensor of a ``_foreach_*`` operator) on ``mesh``: ``add_`` and
    AdamW steps over 8 sharded parameters of different shapes, per parameter then ``foreach``, with their plain
    operators (the step counters) taken out at ``op`` each; with the forward-backward's, which runs collectives
    on ``mesh``."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    placements = [Shard(0)] * mesh.ndim

    def dtensor(*shape: int) -> Any:
        return DTensor.from_local(torch.randn(*shape), mesh, placements, run_check=False)

    params = [torch.nn.Parameter(dtensor(4 * (i + 1), 8 + i)) for i in range(8)]
    for p in params:
        p.grad = dtensor(*cast(DTensor, p).to_local().shape)  # a Parameter made from a DTensor is one
    per: list[float] = []
    for foreach in (False, True):  # one operator per parameter (FSDP2's default), then _foreach_ over the lists
        optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
        optimizer.step()
        with OpCounter() as counter:
            optimizer.step()
        counted = counter.ops
        rest = _median_seconds(optimizer.step, max(3, reps // 3)) - counted.ops * op
        if foreach:
            rest -= counted.dtensor_ops * per[0]
        per.append(max(0.0, rest) / max(1, counted.dtensor_foreach if foreach else counted.dtensor_ops))
    return max(per[0], _dtensor_forward_backward_seconds(mesh, op, reps)), per[1]


def _dtensor_forward_backward_seconds(mesh: Any, op: float, reps: int) -> float:
    """Seconds per operator on DTensors in a forward and backward (layer norm, two sharded linears, SiLU, a view,
    a sum), where most of a tensor-parallel step's DTensor operators are: their sharding propagation costs about
    twice an optimizer's pointwise operator. Not local: ``distribute_tensor`` scatters and broadcasts, and the
    backward all-reduces the sharded linears' input gradient (the counter does not see that collective, and the
    measured cost holds its wait, as a tensor-parallel step's does), so every rank of ``mesh`` must measure at the
    same point (``cpu_rates``)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    shard, replicate = [Shard(0)] * mesh.ndim, [Replicate()] * mesh.ndim
    rows = 32 * mesh.size()
    w1, w2 = (torch.nn.Parameter(distribute_tensor(torch.randn(rows, 32, generator=g), mesh, shard)) for _ in "ab")
    scale = torch.nn.Parameter(distribute_tensor(torch.ones(32), mesh, replicate))
    x = distribute_tensor(torch.randn(4, 8, 32, generator=g), mesh, replicate)

    def step() -> None:
        h = F.layer_norm(x, (32,), scale)
        y = F.silu(F.linear(h, w1)) * F.linear(h, w2)
        y.view(4, 8, 2, rows // 2).transpose(1, 2).sum().backward()

    step()
    with OpCounter() as counter:
        step()
    counted = counter.ops
    if counted.collectives or not counted.dtensor_ops:
        return 0.0
    rest = _median_seconds(step, max(3, reps // 3)) - counted.ops * op
    return max(0.0, rest) / counted.dtensor_ops


@_keeps_random_state
def round_trip_seconds(reps: int = 31) -> tuple[float, float, float]:
    """(seconds per collective, seconds per point-to-point transfer, bytes per second) between the job's
    processes, as a step meets them: what an all-reduce of a few numbers adds to the reference step it follows
    (each process arrives after its own work, as in a training step, not in lock step as back-to-back collectives
    do), over ``reps`` pairs, and what 1 MiB more adds to a bare one. Every rank must call it, at the same point.

    On a box with as many cores as processes about one pair in three meets the other process descheduled and adds
    2-8 ms instead of 0.2-0.4 ms. A collective after symmetric work mostly does not: it costs the lower quartile
    (which moved by 2x between runs on a quiet 2-core machine, where the median moved by 6x). A pipeline stage's
    receive waits for the other stage to be scheduled: it costs the mean.
    """
    import torch
    import torch.distributed as dist

    step = _reference_step()
    small, large = torch.zeros(16), torch.zeros(1 << 18)
    step()
    dist.all_reduce(small)
    added = []
    for _ in range(reps):  # in pairs, so that the machine's load drifting between them cancels
        start = time.perf_counter()
        step()
        middle = time.perf_counter()
        step()
        dist.all_reduce(small)
        added.append((time.perf_counter() - middle) - (middle - start))
    collective = max(0.0, statistics.quantiles(added, n=4)[0])
    transfer = max(collective, statistics.fmean(added))
    bare = _median_seconds(lambda: dist.all_reduce(small), reps)
    extra = _median_seconds(lambda: dist.all_reduce(large), max(3, reps // 2)) - bare
    return collective, transfer, large.numel() * 4 / extra if extra > 0 else float("inf")


def cpu_rates(*, mesh: Any = None, processes: int = 1, save: bool = True) -> CpuRates:
    """This CPU's rates at this process's thread count with ``processes`` processes of the job on the machine
    (each of which measures at the same point): the calibration cache's while a quick timing agrees with it
    (``STALE_FACTOR``; not checked when ``mesh`` is given: then the measurement runs collectives on it, and the
    ranks must decide alike), else measured now (and cached when ``save``). Rates cached without a DTensor cost are
    measured again when ``mesh`` is given, and older entries without the recomputing steps' costs always."""
    import torch

    from convoy.plan.speed.measure import device_identity

    name, uuid, version = device_identity("cpu")
    key = rates_key(torch.get_num_threads(), processes)
    record = load_calibration(device_name=name, device_uuid=uuid, torch_version=version)
    cached = CpuRates.from_dict(record.cpu_ops.get(key, {})) if record is not None else None
    if cached is not None and cached.selective_op_seconds > 0:
        if mesh is None and _current(cached):
            return cached
        # with a mesh the measurement runs collectives: every rank must decide alike, so the cache (one file, the
        # same for all of them) decides, not each rank's own quick timing
        if mesh is not None and cached.dtensor_op_seconds > 0:
            return cached
    rates = measure_cpu_rates(mesh=mesh)
    if save:
        try:
            save_calibration(Calibration(device_name=name, device_uuid=uuid, torch_version=version,
                                         device_type="cpu", cpu_ops={key: rates.as_dict()}))
        except PlanError:
            pass  # the rates just measured serve this plan; the next one measures again
    return rates

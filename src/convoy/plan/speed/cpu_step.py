"""The step of eager PyTorch on CPU processes: the operators one step runs, at this machine's cost per operator,
matmul rate and memory bandwidth.

    from convoy.plan.speed.cpu_step import CpuRates, StepOps, cpu_step
    ops = StepOps(ops=173, gemm_flops=1.8e5, bytes_moved=2.7e5, collectives=3, collective_bytes=5416)
    rates = CpuRates(op_seconds=30e-6, dtensor_op_seconds=60e-6, dtensor_foreach_seconds=20e-6,
                     gemm_flops_per_s=3e10, memory_bytes_per_s=5e9, collective_seconds=150e-6, threads=1)
    step = cpu_step(ops, rates, bubble=0.25)
    step.seconds, step.dispatch, step.gemm, step.memory, step.collectives, step.bubble

An eager step of a small model on a CPU is bound by PyTorch's work per operator (Python, dispatcher, autograd;
a DTensor operator's sharding propagation on top), not by its FLOPs, so it is costed operator by operator
(``cpu_step``). ``StepOps`` is counted by ``convoy.plan.speed.measure_cpu.OpCounter`` on a warm-up step, and
``CpuRates`` measured by ``measure_cpu.cpu_rates`` (cached per CPU, torch version, threads and processes under
the record's ``cpu_ops``), the collectives' and transfers' round trips by the job's own processes. Pure; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["StepOps", "CpuRates", "CpuStep", "cpu_step", "rates_key", "FSDP_UNIT_OPS", "TP_MODULE_OPS"]

#: FSDP2's own Python per sharded unit, forward and backward of one micro-batch, in operators' worth: its hooks
#: gather, swap and free the unit's parameters and queue its gradient reduction around the operators it runs.
#: A stated fit on this project's 2-core machine (torch 2.13, tiny_gpt's 3 units on one process: 2.4 ms per unit
#: beyond its counted operators at 9.5 us per operator; docs/planner-accuracy.md)
FSDP_UNIT_OPS = 250

#: A tensor-parallel module's own Python per forward and backward of one micro-batch, in operators' worth: its
#: parallel style's input and output hooks make DTensors of plain tensors and back (``DTensor.from_local``,
#: ``redistribute``, ``to_local`` and their autograd functions), Python that runs no operator of its own. A stated
#: fit as ``FSDP_UNIT_OPS`` (torch 2.13, examples/tiny_gpt_tp.py's 30 split modules on 2 processes: operators
#: inside the dispatcher took 100 ms of its 180-230 ms step; about 2.5 ms per module beyond them at 10 us per
#: operator; docs/planner-accuracy.md)
TP_MODULE_OPS = 250


@dataclass(frozen=True, kw_only=True)
class StepOps:
    """The operators one training step runs on one process (counted, never timed)."""

    ops: int = 0
    """Operators on plain tensors (views and in-place updates included: each is a dispatch)."""
    dtensor_ops: int = 0
    """Operators on DTensors (each pays DTensor's sharding propagation; its local work is not counted again)."""
    dtensor_foreach: int = 0
    """DTensors in the lists of ``_foreach_*`` operators on DTensors (an optimizer step over sharded parameters)."""
    gemm_flops: float = 0.0
    """FLOPs of the matrix products and attention (2mnk per product), on this process's shards."""
    bytes_moved: float = 0.0
    """Bytes read and written by the operators that are not views (inputs plus outputs, local shards)."""
    collectives: int = 0
    """Collectives and point-to-point transfers (``c10d`` and functional collectives)."""
    fsdp_units: int = 0
    """FSDP2 units forwarded and backwarded (sharded modules x micro-batches): their hooks' Python is no
    operator."""
    collective_bytes: float = 0.0
    """Bytes this process hands to them."""
    transfers: int = 0
    """Of the collectives, the point-to-point sends and receives (a pipeline's activations and gradients)."""
    tp_modules: int = 0
    """Tensor-parallel modules forwarded and backwarded (modules a parallel style split x micro-batches): their
    hooks' Python is no operator."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class CpuRates:
    """What one process achieves on this CPU, at its thread count (measured: ``measure_cpu_rates``)."""

    op_seconds: float
    """Seconds per counted operator of a small training step (module call, autograd and optimizer Python
    included, divided over the operators the step runs)."""
    checkpoint_op_seconds: float = 0.0
    """Seconds per counted operator of the same step with its layers recomputed under torch's non-reentrant
    checkpoint (``recompute="full"``: the saved-tensor hooks' Python and the recomputation's own context), its
    recomputed operators counted too (0: not measured; ``op_seconds`` then)."""
    selective_op_seconds: float = 0.0
    """The same under per-op selective checkpointing (``recompute="selective"``: a dispatch mode's Python and the
    policy's call around every operator of the layers, in the forward and again in the recomputation)."""
    dtensor_op_seconds: float = 0.0
    """Seconds per operator on DTensors (0: not measured, no DTensor at hand)."""
    dtensor_foreach_seconds: float = 0.0
    """Seconds per DTensor in a ``_foreach_*`` operator's lists (0: not measured)."""
    gemm_flops_per_s: float
    """FLOP/s of a mid-sized fp32 matrix product."""
    memory_bytes_per_s: float
    """Bytes per second read + written by a copy."""
    collective_seconds: float = 0.0
    """Seconds per collective between the job's processes (a round trip over gloo, measured by the job on its own
    processes: ``convoy.plan.speed.measure_cpu.round_trip_seconds``; never cached)."""
    transfer_seconds: float = 0.0
    """Seconds per point-to-point send or receive between them (likewise): a pipeline stage's receive waits for
    the other stage to be scheduled, which the collectives of symmetric work mostly do not."""
    collective_bytes_per_s: float = math.inf
    """Bytes per second a collective moves between them (likewise; inf: not measured)."""
    threads: int = 1
    """``torch.get_num_threads()`` when measured: what the rates are for."""
    measured_at: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CpuRates | None:
        """A cached entry, or None when it is not one (a damaged or older entry is measured again)."""
        names = {f.name for f in fields(cls)}
        try:
            rates = cls(**{k: v for k, v in d.items() if k in names})
        except TypeError:
            return None
        def number(v: Any, low: float) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > low

        positive = all(number(v, 0) for v in (rates.op_seconds, rates.gemm_flops_per_s, rates.memory_bytes_per_s))
        rest = all(number(v, -1e-300) for v in (rates.dtensor_op_seconds, rates.dtensor_foreach_seconds,
                                                 rates.collective_seconds, rates.transfer_seconds,
                                                 rates.checkpoint_op_seconds, rates.selective_op_seconds))
        return rates if positive and rest and isinstance(rates.threads, int) else None

    def op_seconds_for(self, recompute: str) -> float:
        """Seconds per counted operator of a step that recomputes its layers as ``recompute`` says (``"none"``,
        ``"full"``, ``"selective"``)."""
        measured = {"full": self.checkpoint_op_seconds, "selective": self.selective_op_seconds}.get(recompute, 0.0)
        return measured or self.op_seconds

    def describe(self, recompute: str = "none") -> str:
        """One sentence: where a CPU plan's step time comes from (for a step recomputing as ``recompute`` says)."""
        mode = f", {recompute} recompute" if self.op_seconds_for(recompute) != self.op_seconds else ""
        return (f"PyTorch's cost per operator measured on this CPU ({self.op_seconds_for(recompute) * 1e6:.0f} us"
                f"{mode}, {self.threads} thread{'s' if self.threads > 1 else ''}) x the operators one step runs")


def rates_key(threads: int, processes: int = 1) -> str:
    """The cache key of rates measured at ``threads`` intra-op threads while ``processes`` processes of one job
    share the machine (two processes on two cores each get about half of what one gets alone)."""
    return f"{threads} thread{'s' if threads > 1 else ''} x {processes} process{'es' if processes > 1 else ''}"


@dataclass(frozen=True, kw_only=True)
class CpuStep:
    """Seconds of one step on one CPU process, by part (``cpu_step``)."""

    dispatch: float
    """Operators at the per-operator cost (plain and DTensor)."""
    gemm: float
    """Matrix products at the matmul rate."""
    memory: float
    """Bytes moved at the copy bandwidth."""
    collectives: float
    """Collectives and transfers: round trips and bytes."""
    bubble: float
    """Pipeline idle time (the schedule's idle fraction of the work above)."""

    @property
    def seconds(self) -> float:
        return self.dispatch + self.gemm + self.memory + self.collectives + self.bubble


def cpu_step(ops: StepOps, rates: CpuRates, *, bubble: float = 0.0, recompute: str = "none") -> CpuStep:
    """One step of ``ops`` at ``rates``::

        seconds = (ops x op_seconds_for(recompute) + (fsdp_units x FSDP_UNIT_OPS + tp_modules x TP_MODULE_OPS)
                   x op_seconds
                   + dtensor_ops x dtensor_op_seconds + dtensor_foreach x dtensor_foreach_seconds
                   + gemm_flops / gemm_flops_per_s + bytes_moved / memory_bytes_per_s
                   + (collectives - transfers) x collective_seconds + transfers x transfer_seconds
                   + collective_bytes / collective_bytes_per_s) x (1 + bubble)

    ``bubble``: the pipeline's idle fraction of the busy time (``convoy.plan.schedules.pipeline_bubble``; 0 without
    pp): a stage's own operators are counted, its waiting for the other stages is not. ``recompute``: how the step
    recomputes its layers, which costs every plain operator more (``CpuRates.op_seconds_for``); FSDP2's and the
    parallel styles' hooks run once per unit and module whether or not it recomputes."""
    dispatch = (ops.ops * rates.op_seconds_for(recompute)
                + (ops.fsdp_units * FSDP_UNIT_OPS + ops.tp_modules * TP_MODULE_OPS) * rates.op_seconds
                + ops.dtensor_ops * rates.dtensor_op_seconds + ops.dtensor_foreach * rates.dtensor_foreach_seconds)
    gemm = ops.gemm_flops / rates.gemm_flops_per_s
    memory = ops.bytes_moved / rates.memory_bytes_per_s
    collectives = ((ops.collectives - ops.transfers) * rates.collective_seconds + ops.transfers * rates.transfer_seconds
                   + ops.collective_bytes / rates.collective_bytes_per_s)
    busy = dispatch + gemm + memory + collectives
    return CpuStep(dispatch=dispatch, gemm=gemm, memory=memory, collectives=collectives, bubble=busy * bubble)

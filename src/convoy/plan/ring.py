"""torch's ring attention (context parallelism) as the planner prices it: the kernels each rank runs, the fp32 merge
and gradient traffic beside them, and the K/V collectives, step by step as torch runs them.

    from convoy.plan.ring import ring_kernels, ring_traffic_bytes, ring_exchange
    first, later = ring_kernels(rates, batch=1, heads=32, seq=262144, head_dim=128, cp=8, dtype="bf16")
    forward, backward = ring_traffic_bytes(batch=1, heads=32, seq=262144, head_dim=128, cp=8)
    exchange = ring_exchange(batch=1, heads=32, seq=262144, head_dim=128, cp=8, activation_bytes=2)

What it follows is ``torch.distributed.tensor.experimental._context_parallel._attention`` (``_templated_ring_attention``
and ``_templated_ring_attention_backward``, torch 2.6-2.13; torchtitan's context parallelism and convoy's
``convoy.train.parallel.context`` both run it):

- Each rank holds ``seq / cp`` tokens as two head-tail half-chunks (load balanced). Step 0 is one causal kernel over
  the local queries and keys; each of the ``cp - 1`` later steps is one non-causal kernel of the local queries over
  half the arriving keys, or half the queries over all of them: the FLOPs of the causal step 0, without its masked
  tiles. K and V reach the ring with every query head (torchtitan's ``repeat_kv``, convoy's ``repeat_interleave``
  for ``enable_gqa``), so the ring moves and computes with ``heads`` K/V heads, not the model's KV heads.
- ``_SDPAMerger`` merges each later step's output into the running one in fp32 (``convert_to_f32``): the block's
  output cast up, three element-wise kernels over it, and, for a half-query step, the output rebuilt by
  ``torch.cat``; the K/V buffer to send is a ``torch.cat`` of K and V at every step.
- The backward accumulates dq, dk, dv in fp32 (``accum_dtype``): each step adds its kernel's 16-bit gradients, rebuilds
  the half it touched by ``torch.cat`` (``_partial_update``), and concatenates dk and dv (fp32) for the next rank.
- The forward's K/V travel by one all-gather (torch's default rotate method, ``ALL_GATHER``; convoy's ``allgather``)
  issued before step 0 and awaited at step 1: it hides behind step 0's kernel. The backward all-gathers K/V again the
  same way, and rotates the fp32 dk, dv by all-to-all (``_AllToAllRotater``, whatever the rotate method) after every
  step: the transfer of step i hides behind step i + 1's kernel, and the last one, awaited after the loop, behind
  nothing.

Torch-free and pure (``convoy.plan.timing`` calls it for a layout with cp > 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy.plan.speed.rates import Rates

__all__ = ["NONCAUSAL_SPEEDUP", "MERGE_BYTES_PER_ELEMENT", "GRADIENT_BYTES_PER_ELEMENT", "RING_STEP_KERNELS",
           "RingExchange", "ring_kernels", "ring_traffic_bytes", "ring_exchange"]

#: a non-causal attention kernel's rate over a causal one's at the same FLOPs: FlashAttention-2's forward on an
#: H100 SXM5, head dim 128, 16k tokens, 370 TFLOPs/s without the causal mask and 335 with it (Shah et al. 2024,
#: FlashAttention-3, arXiv:2407.08608, figure 4; the backward's causal figure is not published, so the forward's
#: ratio stands for both)
NONCAUSAL_SPEEDUP = 370 / 335
#: bytes the forward's merge reads and writes per element of a later step's output (b x heads x local tokens x
#: head dim), counted from ``_SDPAMerger.step``: the 16-bit block output cast to fp32 (2 + 4), ``out - block_out``
#: (4 + 4 + 4), ``sigmoid(...) * ...`` (4 + 4), ``out - ...`` (4 + 4 + 4), and the next K/V buffer's ``torch.cat``
#: (K and V, 16 bits, read and written: 8); the log-sum-exp terms are a head dim smaller and left out
MERGE_BYTES_PER_ELEMENT = 6 + 12 + 8 + 12 + 8
#: bytes the backward reads and writes per element of a step's gradients, counted from
#: ``_templated_ring_attention_backward``: the next K/V buffer's ``torch.cat`` (8), dk and dv each added in fp32
#: (4 + 2 + 4) and rebuilt by ``_partial_update``'s ``torch.cat`` (4 + 4) for the half a step touched, the fp32
#: ``torch.cat`` of dk and dv sent on (2 x (4 + 4)), dq added in fp32 (4 + 2 + 4)
GRADIENT_BYTES_PER_ELEMENT = 8 + 2 * (10 + 8) + 16 + 10
#: kernels each later step launches beside its attention kernel (forward merge and K/V buffer; backward
#: accumulation, rebuilds and the dk/dv buffer), counted from the same functions
RING_STEP_KERNELS = (11, 8)


@dataclass(frozen=True, kw_only=True)
class RingExchange:
    """What one layer's ring sends per rank, and the pieces the exposed time is made of."""

    kv_bytes: float
    """This rank's K and V (16 bits, every query head): what the all-gather takes from each rank."""
    gradient_bytes: float
    """This rank's dk and dv in fp32: what each of the backward's all-to-all rotations moves."""


def ring_kernels(rates: Rates, *, batch: int, heads: int, seq: int, head_dim: int, cp: int, dtype: str
                 ) -> tuple[float, float]:
    """(seconds of step 0's attention kernel, of one later step's), forward + backward, for one layer on one rank of
    a cp ring over ``seq`` tokens: step 0 causal over ``seq / cp`` tokens at ``rates``, a later step the same FLOPs
    at the non-causal kernel's rate (``NONCAUSAL_SPEEDUP``)."""
    local = max(1, seq // cp)
    first = rates.attention_seconds(batch, heads, heads, local, head_dim, dtype)
    return first, first / NONCAUSAL_SPEEDUP


def ring_traffic_bytes(*, batch: int, heads: int, seq: int, head_dim: int, cp: int) -> tuple[float, float]:
    """(bytes the forward's merges move, bytes the backward's fp32 accumulation moves) through device memory, for one
    layer on one rank: ``MERGE_BYTES_PER_ELEMENT`` per element of each of the ``cp - 1`` later steps' outputs, and
    ``GRADIENT_BYTES_PER_ELEMENT`` per element of each of the ``cp`` steps' gradients (step 0's accumulate too)."""
    elements = batch * heads * max(1, seq // cp) * head_dim
    return (cp - 1) * MERGE_BYTES_PER_ELEMENT * elements, cp * GRADIENT_BYTES_PER_ELEMENT * elements


def ring_exchange(*, batch: int, heads: int, seq: int, head_dim: int, cp: int, activation_bytes: int
                  ) -> RingExchange:
    """The bytes one layer's ring moves per rank (``RingExchange``)."""
    elements = 2 * batch * heads * max(1, seq // cp) * head_dim  # K and V
    return RingExchange(kv_bytes=elements * activation_bytes, gradient_bytes=elements * 4)

"""What each accelerator architecture attains, from public measurements of it: the facts the compute model needs.

    from convoy.plan.architectures import ARCHITECTURES, power_limited_mhz
    ARCHITECTURES["hopper"].gemm_fraction        # 0.803: cuBLAS's best bf16 GEMM over the H100 SXM's peak
    power_limited_mhz(lookup_gpu("H100-NVL"))    # the clock a GEMM holds under the board's power limit

A board (``convoy.plan.hardware.GpuSpec``) names its architecture. Each ``Architecture`` holds the fractions of the
peak its reference board reaches (best GEMM, fused attention, large copy), the source of each, the GEMM tiles its
library runs, and the reference board's units, clock and power, from which ``power_limited_mhz`` carries the
fractions to another board of the architecture. ``convoy.plan.speed.rates.ModeledRates`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Architecture", "ARCHITECTURES", "DEFAULT_ARCHITECTURE", "power_limited_mhz", "architecture_of"]

_MAMF = ("Maximum Achievable Matmul FLOPS table, BF16 (stas00/ml-engineering, compute/accelerator/README.md, "
         "mamf-finder.py)")
_GPU_TILES = ((128, 256), (256, 128), (128, 128))


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """One architecture's attainable fractions and the board they were measured on."""

    name: str
    gemm_fraction: float
    """Best bf16 GEMM over the dense peak on the reference board, by Bekman's Maximum Achievable Matmul FLOPS finder
    (MAMF): it already holds that board's clock under its power limit and its library's best tiles."""
    gemm_source: str
    attention_fraction: float
    """Fused causal attention forward + backward over the peak, against the non-causal count 12·b·a·s²·d FLOPs the
    time model uses; architectures without a published measurement take Hopper's."""
    attention_source: str
    reference: str
    """The board the fractions were measured on."""
    reference_units: int
    reference_mhz: float
    """Its clock under a GEMM at its power limit (its dense peak's clock, unless measured lower)."""
    reference_power_w: float
    memory_fraction: float = 0.835
    """A large copy's bandwidth over the datasheet's (the H100 profile: 2.80 of 3.35 TB/s)."""
    tiles: tuple[tuple[int, int], ...] = _GPU_TILES
    """The output tiles (rows x columns) its GEMM library runs, one per compute unit at a time: CUTLASS / cuBLAS and
    hipBLASLt sizes, 256 x 256 for a Gaudi MME."""


#: the H100 profile's own torch SDPA measurement. FlashAttention-2 (figures 5-8) reaches 1.9x the fraction of the
#: peak on an A100 (203 of 312 TFLOPs/s) that it reaches on an H100 (335 of 989.4), which gives Ampere's.
_HOPPER_ATTENTION = 0.61
_FA2 = "FlashAttention-2 (Dao 2023, arXiv:2307.08691): H100 335 TFLOPs/s, A100 203 TFLOPs/s forward + backward"

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture(name="ampere", gemm_fraction=0.869, gemm_source=f"{_MAMF}: A100 SXM 271.2 of 312 TFLOPs",
                 attention_fraction=round(_HOPPER_ATTENTION * (203 / 312) / (335 / 989.4), 3), attention_source=_FA2,
                 reference="A100 SXM4", reference_units=108, reference_mhz=1410, reference_power_w=400),
    Architecture(name="ampere-ga102", gemm_fraction=0.869, gemm_source="the A100's (no MAMF measurement of GA102)",
                 attention_fraction=round(_HOPPER_ATTENTION * (203 / 312) / (335 / 989.4), 3), attention_source=_FA2,
                 reference="A10 (GA102, another die than the A100's)", reference_units=72, reference_mhz=1695,
                 reference_power_w=150),
    Architecture(name="hopper", gemm_fraction=0.803, gemm_source=f"{_MAMF}: H100 SXM 794.5 of 989 TFLOPs",
                 attention_fraction=_HOPPER_ATTENTION,
                 attention_source="the H100 profile's torch SDPA (plan/speed/device_profiles/h100-80gb.json)",
                 reference="H100 SXM5", reference_units=132, reference_mhz=1830, reference_power_w=700),
    Architecture(name="blackwell", gemm_fraction=0.776, gemm_source=f"{_MAMF}: B200 SXM 1,745 of 2,250 TFLOPs",
                 attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's (no public measurement read)",
                 reference="B200 (HGX)", reference_units=148, reference_mhz=1855, reference_power_w=1000),
    Architecture(name="ada", gemm_fraction=0.803, gemm_source="Hopper's (no MAMF measurement of an Ada board)",
                 attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's (no public measurement read)",
                 reference="L40S", reference_units=142, reference_mhz=2490, reference_power_w=350),
    Architecture(name="volta", gemm_fraction=0.869, gemm_source="Ampere's (no MAMF measurement of a V100)",
                 attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's (no fused attention on Volta)",
                 reference="V100 SXM2", reference_units=80, reference_mhz=1530, reference_power_w=300),
    Architecture(name="turing", gemm_fraction=0.869, gemm_source="Ampere's (no MAMF measurement of a T4)",
                 attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's",
                 reference="T4", reference_units=40, reference_mhz=1590, reference_power_w=70),
    Architecture(name="cdna2", gemm_fraction=0.767, gemm_source=f"{_MAMF}, earlier table: MI250X 147.0 of 191.5 "
                 "TFLOPs on one GCD", attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's",
                 reference="MI250X (one GCD)", reference_units=110, reference_mhz=1700, reference_power_w=280),
    Architecture(name="cdna3", gemm_fraction=0.514, gemm_source=f"{_MAMF}: MI300X 668.4 of 1,300 TFLOPs",
                 attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's",
                 reference="MI300X", reference_units=304, reference_mhz=2100, reference_power_w=750),
    Architecture(name="gaudi2", gemm_fraction=0.969, gemm_source=f"{_MAMF}: Gaudi 2 418.7 of 432 TFLOPs",
                 attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's",
                 reference="Gaudi 2 (HL-225)", reference_units=2, reference_mhz=1650, reference_power_w=600,
                 tiles=((256, 256),)),
    Architecture(name="gaudi3", gemm_fraction=0.741, gemm_source=f"{_MAMF}: Gaudi 3 1,243 of the 1,677 TFLOPs of "
                 "its 1,600 MHz", attention_fraction=_HOPPER_ATTENTION, attention_source="Hopper's",
                 reference="Gaudi 3 (HL-325L, MMEs at 1,600 MHz)", reference_units=8, reference_mhz=1600,
                 reference_power_w=900, tiles=((256, 256),)),
)}

#: what a board without an architecture (a user's ``--peak-tflops`` device, the CPU) is modeled as
DEFAULT_ARCHITECTURE = ARCHITECTURES["hopper"]


def architecture_of(gpu: Any) -> Architecture:
    """``gpu``'s architecture (``GpuSpec.arch``), Hopper's figures for a board that names none."""
    return ARCHITECTURES.get(getattr(gpu, "arch", None) or "", DEFAULT_ARCHITECTURE)


def power_limited_mhz(gpu: Any) -> float | None:
    """The clock ``gpu`` holds under a GEMM at its power limit: its datasheet peak's clock, lowered where it has
    less power per compute unit than its architecture's reference board; None when the row lacks the numbers.

    Dynamic power grows as f·V² with V growing with f, so as f³ (the usual DVFS law). Checked against NVIDIA's own
    figures: it puts the 400 W, 132-SM H100 NVL at 1,519 MHz where its datasheet peak implies 1,545, and MAMF's
    A100 PCIe (300 W) at 0.909 of the SXM's clock, 79.0 % of peak, where MAMF measured 81.1 %."""
    clock, units, power = (getattr(gpu, name, None) for name in ("clock_mhz", "units", "power_w"))
    arch = ARCHITECTURES.get(getattr(gpu, "arch", None) or "")
    if clock is None:
        return None
    if arch is None or units is None or power is None:
        return float(clock)
    law = arch.reference_mhz * (power / arch.reference_power_w * arch.reference_units / units) ** (1 / 3)
    return float(min(clock, law))

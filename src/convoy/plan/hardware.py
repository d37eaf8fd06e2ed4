"""Hardware facts the planner uses: a table of common accelerators (one source per row) and the machine shape.

    from convoy.plan.hardware import parse_hardware, lookup_gpu
    hw = parse_hardware("8xH100-80GB", nodes=2, intra="nvlink", inter_gbps=3200)
    hw.world_size, hw.gpu.memory_bytes, hw.gpu.peak_flops("bf16")     # 16, 85520809984, 9.894e14
    lookup_gpu("NVIDIA A100-SXM4-80GB").name                          # 'A100-80GB'

Peak FLOPs are the datasheets' dense figures (no 2:4 sparsity); memory is what ``nvidia-smi`` reports as
total for that board (slightly less than the marketing size). Link bandwidths are per GPU and per direction,
which is what a ring collective can use: NVLink 4 is 900 GB/s "total" = 450 GB/s each way. Every number is
an input: pass your own ``GpuSpec`` (or ``--gpu-memory-gib``/``--peak-tflops``/``--intra-gbps`` on the CLI)
where your board differs. Probing the machine is elsewhere (``convoy.devices``); ``hardware_from_inventory``
turns its inventory into a ``Hardware``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from convoy.errors import PlanError
from convoy.plan.architectures import power_limited_mhz
from convoy.plan.memo import hashed_once
from convoy.plan.units import GB, MiB

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["GpuSpec", "Hardware", "GPUS", "CPU", "lookup_gpu", "board_for", "parse_hardware", "hardware_from_inventory"]


@hashed_once
@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator model's published numbers."""

    name: str
    """Short name used on the command line, e.g. ``"H100-80GB"``."""
    memory_bytes: int
    """Total device memory as ``nvidia-smi`` reports it."""
    bf16_tflops: float | None
    """Dense bf16 tensor-core peak (None: no bf16 support)."""
    fp16_tflops: float
    """Dense fp16 tensor-core peak."""
    fp32_tflops: float | None
    """Plain fp32 peak (PyTorch does not use TF32 for matmuls by default); None: not published."""
    nvlink_gbs: float | None
    """Peer link bandwidth per GPU, one direction, GB/s (NVLink / Infinity Fabric / Gaudi's scale-up ports);
    None when absent."""
    pcie_gbs: float
    """Host link bandwidth, one direction, GB/s (PCIe x16 of the board's generation)."""
    memory_gbs: float | None = None
    """Device memory bandwidth, GB/s (the datasheet's HBM/GDDR figure); None: unknown, so the step-time model
    leaves memory-bound work out."""
    source: str
    """Where the numbers come from."""
    aliases: tuple[str, ...] = ()
    """Lower-case substrings that identify this board in a device name from NVML/ROCm."""
    kind: str = "gpu"
    """``"gpu"`` for an accelerator, ``"cpu"`` for CPU processes (``CPU``): what plans and explanations call it."""
    arch: str | None = None
    """Architecture (``convoy.plan.architectures``: what its GEMMs and attention attain); None: Hopper's figures."""
    units: int | None = None
    """Compute units a GEMM's tiles are spread over: SMs (NVIDIA), CUs (AMD, per GCD), MMEs (Gaudi)."""
    boost_mhz: float | None = None
    """The highest clock the board runs (its datasheet's or whitepaper's boost clock)."""
    clock_mhz: float | None = None
    """The clock its dense peak is stated at (peak / (units x FLOPs per unit and clock)); ``power_limited_mhz``
    lowers it where the board's power limit does."""
    power_w: float | None = None
    """Board power limit (TDP), W."""
    fp8_tflops: float | None = None
    """Dense float8 (e4m3/e5m2) tensor-core peak, the datasheet's figure without sparsity; None: the board has no
    float8 tensor cores (A100, V100, T4, A10, MI250X), or torchao's ``Float8Linear`` does not run on it (Gaudi)."""
    fp8_source: str = ""
    """Where ``fp8_tflops`` comes from (the datasheet and its column)."""

    @property
    def noun(self) -> str:
        """What one device is called in a sentence: ``"GPU"``, or ``"CPU process"``."""
        return "CPU process" if self.kind == "cpu" else "GPU"

    @property
    def power_limited_mhz(self) -> float | None:
        """The clock a GEMM holds under the board's power limit (``convoy.plan.architectures``)."""
        return power_limited_mhz(self)

    def describe(self) -> str:
        """``H100-80GB (132 SMs, 1830 MHz under 700 W, 3350 GB/s)``: what a plan assumed of the board."""
        facts = []
        if self.units:
            facts.append(f"{self.units} {_UNIT_NAMES.get(self.arch or '', 'SMs')}")
        clock = self.power_limited_mhz
        if clock:
            facts.append(f"{clock:.0f} MHz" + (f" under {self.power_w:g} W" if self.power_w else ""))
        if self.memory_gbs:
            facts.append(f"{self.memory_gbs:g} GB/s")
        return f"{self.name} ({', '.join(facts)})" if facts else self.name

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``"bf16"``, ``"fp16"``, ``"fp32"`` or ``"fp8"`` compute."""
        if dtype == "fp8":
            if self.fp8_tflops is None:
                raise PlanError(f"{self.name} has no float8 tensor cores; plan fp8 for a board that has them "
                                f"(H100, H200, B200, L40S, L4, MI300X), or leave fp8 out")
            return self.fp8_tflops * 1e12
        if dtype == "bf16":
            if self.bf16_tflops is None:
                raise PlanError(f"{self.name} has no bf16 support; use precision fp16 or fp32")
            return self.bf16_tflops * 1e12
        if dtype == "fp16":
            return self.fp16_tflops * 1e12
        if dtype == "fp32":
            if self.fp32_tflops is None:
                raise PlanError(f"{self.name} has no published fp32 peak; use precision bf16, or give --peak-tflops")
            return self.fp32_tflops * 1e12
        raise PlanError(f"unknown compute dtype {dtype!r}; use bf16, fp16 or fp32")


_UNIT_NAMES = {"cdna2": "CUs", "cdna3": "CUs", "gaudi2": "MMEs", "gaudi3": "MMEs"}


def _gpu(name, mib, bf16, fp16, fp32, nvlink, pcie, source, aliases=(), *, hbm, arch=None, units=None, boost=None,
         clock=None, power=None, fp8=None, fp8_source="") -> GpuSpec:
    return GpuSpec(name=name, memory_bytes=mib * MiB, bf16_tflops=bf16, fp16_tflops=fp16, fp32_tflops=fp32,
                   nvlink_gbs=nvlink, pcie_gbs=pcie, memory_gbs=hbm, source=source, aliases=aliases, arch=arch,
                   units=units, boost_mhz=boost, clock_mhz=clock, power_w=power, fp8_tflops=fp8,
                   fp8_source=fp8_source)


_H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (SMs, clocks)"
_A100_WP = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 1410 MHz boost)"
_ADA_WP = "NVIDIA Ada GPU Architecture whitepaper (SMs, boost clocks; 1024 dense fp16 FLOPs per SM and clock)"
#: the 500 W, 96 GB HBM2e H100 (Meta's Grand Teton, torchtitan's benchmarks): no datasheet; its peak is the SXM5's
#: at the clock the f^3 power law gives 500 W (convoy.plan.architectures): 1830 x (500/700)^(1/3) = 1636 MHz
_H100_500W_MHZ = 1830 * (500 / 700) ** (1 / 3)

# name -> spec. Memory: nvidia-smi's "total" for the board. Links: GB/s per GPU per direction. hbm: the same
# datasheet's memory bandwidth, GB/s. units/boost/clock/power: SMs (CUs, MMEs), boost clock, the clock the dense
# peak is stated at (peak / (units x FLOPs per unit and clock)), TDP.
GPUS: dict[str, GpuSpec] = {g.name.lower(): g for g in (
    _gpu("H100-80GB", 81559, 989.4, 989.4, 66.9, 450, 64,
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5, 700 W): https://resources.nvidia.com/en-us-tensor-core/nvidia-"
         f"tensor-core-gpu-datasheet; {_H100_WP}: 132 SMs, 1980 MHz boost; peak at 1830 MHz (4096 FLOPs/SM/clock)",
         ("h100 80gb hbm3", "h100-sxm", "h100-sxm5", "h100 sxm"), hbm=3350, arch="hopper", units=132, boost=1980,
         clock=1830, power=700,
         fp8=1978.9, fp8_source="NVIDIA H100 datasheet, SXM column: FP8 Tensor Core 3,958 TFLOPS with sparsity, "
         "1,978.9 dense"),
    _gpu("H100-96GB-500W", 91553, round(132 * 4096 * _H100_500W_MHZ / 1e6, 1),
         round(132 * 4096 * _H100_500W_MHZ / 1e6, 1), round(66.9 * _H100_500W_MHZ / 1830, 1), 450, 64,
         "H100 SXM with 96 GB HBM2e at 2.4 TB/s and a 500 W limit, as pytorch/torchtitan benchmarks/"
         "llama3_h100_202412_torchtitan.md describes its boards (no datasheet: 'between SXM and NVL'); peak = the "
         "SXM5's 132 SMs at the 1636 MHz the f^3 power law gives 500 W; memory: 96 GB", (), hbm=2400,
         arch="hopper", units=132, boost=1980, clock=round(_H100_500W_MHZ), power=500,
         fp8=round(2 * 132 * 4096 * _H100_500W_MHZ / 1e6, 1), fp8_source="twice its bf16 peak, as on every Hopper "
         "datasheet (H100 SXM: 1,978.9 fp8 / 989.4 bf16), at the same 1636 MHz"),
    _gpu("H100-PCIE", 81559, 756.5, 756.5, 51.2, None, 64,
         "NVIDIA H100 datasheet (PCIe column, 350 W; the optional NVLink bridge pairs only two boards); "
         f"{_H100_WP}: 114 SMs, 1755 MHz boost; peak at 1620 MHz", ("h100 pcie",), hbm=2000, arch="hopper",
         units=114, boost=1755, clock=1620, power=350,
         fp8=1513, fp8_source="NVIDIA H100 datasheet, PCIe column: FP8 Tensor Core 3,026 TFLOPS with sparsity, 1,513 "
         "dense"),
    _gpu("H100-NVL", 95330, 835.5, 835.5, 60, None, 64,
         "NVIDIA H100 datasheet (H100 NVL column, dense, 350-400 W; its NVLink bridge pairs only two boards); memory: "
         "NVML's 99,961,274,368 bytes, to the MiB; 132 SMs, 1785 MHz boost; peak at 1545 MHz", ("h100 nvl",),
         hbm=3900, arch="hopper", units=132, boost=1785, clock=1545, power=400,
         fp8=1670.5, fp8_source="NVIDIA H100 datasheet, H100 NVL column: FP8 Tensor Core 3,341 TFLOPS with sparsity, "
         "1,670.5 dense"),
    _gpu("H200-141GB", 143771, 989.4, 989.4, 66.9, 450, 64,
         "NVIDIA H200 datasheet (SXM, up to 700 W): https://www.nvidia.com/en-us/data-center/h200/; the H100 SXM5's "
         "132 SMs and clocks", ("h200",), hbm=4800, arch="hopper", units=132, boost=1980, clock=1830, power=700,
         fp8=1978.9, fp8_source="NVIDIA H200 datasheet, SXM column: FP8 Tensor Core 3,958 TFLOPS with sparsity, "
         "1,978.9 dense"),
    _gpu("B200", 171661, 2250, 2250, 80, 900, 64,
         "NVIDIA HGX B200 datasheet (per GPU: 4.5 PFLOPs fp16 with sparsity, 2.25 dense; 180 GB HBM3e at 8 TB/s; "
         "NVLink 5 at 1.8 TB/s total; 1000 W): https://www.nvidia.com/en-us/data-center/hgx/; 148 SMs; peak at "
         "1855 MHz (twice Hopper's 4096 FLOPs/SM/clock); memory: 180 GB, as printed", ("nvidia b200",), hbm=8000,
         arch="blackwell", units=148, clock=1855, power=1000,
         fp8=4500, fp8_source="NVIDIA HGX B200 datasheet: FP8 Tensor Core 9 PFLOPS per GPU with sparsity, 4.5 dense"),
    # the PCIe boards come before the SXM rows, whose shorter aliases ("a100 80gb") their names also contain
    _gpu("A100-PCIE-80GB", 81920, 312, 312, 19.5, None, 32,
         f"NVIDIA A100 datasheet (PCIe column, 300 W; the optional NVLink bridge pairs only two boards); {_A100_WP}",
         ("a100 80gb pcie", "a100-pcie-80gb", "a100 pcie 80gb"), hbm=1935, arch="ampere", units=108, boost=1410,
         clock=1410, power=300),
    _gpu("A100-PCIE-40GB", 40960, 312, 312, 19.5, None, 32,
         f"NVIDIA A100 datasheet (PCIe 40GB, 250 W); {_A100_WP}", ("a100-pcie-40gb", "a100 40gb pcie"), hbm=1555,
         arch="ampere", units=108, boost=1410, clock=1410, power=250),
    _gpu("A100-80GB", 81920, 312, 312, 19.5, 300, 32,
         "NVIDIA A100 datasheet (SXM4, 400 W, NVLink 3 600 GB/s total): "
         f"https://www.nvidia.com/en-us/data-center/a100/; {_A100_WP}",
         ("a100-sxm4-80gb", "a100-sxm-80gb", "a100 80gb", "a100-80gb"), hbm=2039, arch="ampere", units=108,
         boost=1410, clock=1410, power=400),
    _gpu("A100-40GB", 40960, 312, 312, 19.5, 300, 32,
         f"NVIDIA A100 datasheet (SXM4 40GB, 400 W); {_A100_WP}",
         ("a100-sxm4-40gb", "a100-sxm-40gb", "a100 40gb", "a100-40gb"), hbm=1555, arch="ampere", units=108,
         boost=1410, clock=1410, power=400),
    _gpu("V100-32GB", 32768, None, 125, 15.7, 150, 16,
         "NVIDIA V100 datasheet (SXM2, 300 W, NVLink 2 300 GB/s total): "
         "https://www.nvidia.com/en-us/data-center/v100/; Volta whitepaper: 80 SMs, 1530 MHz boost",
         ("v100-sxm2-32gb", "v100 32gb", "v100-32gb"), hbm=900, arch="volta", units=80, boost=1530, clock=1530,
         power=300),
    _gpu("V100-16GB", 16160, None, 125, 15.7, 150, 16, "NVIDIA V100 datasheet (SXM2 16GB, 300 W); 80 SMs, 1530 MHz",
         ("v100-sxm2-16gb", "v100-16gb"), hbm=900, arch="volta", units=80, boost=1530, clock=1530, power=300),
    _gpu("L40S", 46068, 362.05, 362.05, 91.6, None, 32,
         "NVIDIA L40S datasheet (dense, without sparsity; 350 W): https://www.nvidia.com/en-us/data-center/l40s/; "
         f"{_ADA_WP}: 142 SMs, 2520 MHz boost; peak at 2490 MHz", ("l40s",), hbm=864, arch="ada", units=142,
         boost=2520, clock=2490, power=350,
         fp8=733, fp8_source="NVIDIA L40S datasheet: FP8 Tensor Core 733 TFLOPS dense (1,466 with sparsity)"),
    _gpu("L4", 23034, 121, 121, 30.3, None, 32,
         "NVIDIA L4 datasheet (dense, without sparsity; 72 W): https://www.nvidia.com/en-us/data-center/l4/; "
         f"{_ADA_WP}: 58 SMs, 2040 MHz boost", ("nvidia l4",), hbm=300, arch="ada", units=58, boost=2040,
         clock=2040, power=72,
         fp8=242.5, fp8_source="NVIDIA L4 datasheet: FP8 Tensor Core 485 TFLOPS with sparsity, 242.5 dense"),
    # before A10, whose alias "nvidia a10" the A10G's NVML name also contains
    _gpu("A10G", 23028, 70, 70, 35, None, 32,
         "AWS's variant of the A10 (G5 instances); neither NVIDIA nor AWS publish a datasheet: tensor and fp32 "
         "figures from Baseten's A10 vs A10G comparison (https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-"
         "model-inference/), memory and bandwidth as the A10's", ("nvidia a10g",), hbm=600, arch="ampere-ga102"),
    _gpu("A10", 23028, 125, 125, 31.2, None, 32,
         "NVIDIA A10 datasheet (150 W): https://www.nvidia.com/en-us/data-center/products/a10-gpu/; GA102: 72 SMs, "
         "1695 MHz boost", ("nvidia a10",), hbm=600, arch="ampere-ga102", units=72, boost=1695, clock=1695, power=150),
    _gpu("T4", 15360, None, 65, 8.1, None, 16,
         "NVIDIA T4 datasheet (70 W): https://www.nvidia.com/en-us/data-center/tesla-t4/; Turing whitepaper: 40 SMs, "
         "1590 MHz boost", ("tesla t4",), hbm=320, arch="turing", units=40, boost=1590, clock=1590, power=70),
    _gpu("RTX4090", 24564, 165.2, 165.2, 82.6, None, 32,
         f"{_ADA_WP}, RTX 4090 (fp16/bf16 with fp32 accumulate, dense, at half the L40S's rate per SM; 450 W): "
         "128 SMs, 2520 MHz boost", ("rtx 4090",), hbm=1008, arch="ada", units=128, boost=2520, clock=2520,
         power=450,
         fp8=330.3, fp8_source="NVIDIA Ada GPU Architecture whitepaper, RTX 4090: peak FP8 Tensor TFLOPS with FP32 "
         "accumulate 330.3 dense (660.6 with sparsity)"),
    _gpu("MI300X", 196592, 1307.4, 1307.4, 163.4, 448, 64,
         "AMD Instinct MI300X datasheet (750 W; 7 Infinity Fabric links x 64 GB/s each way; 304 CUs at 2100 MHz): "
         "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html", ("mi300x",), hbm=5300,
         arch="cdna3", units=304, boost=2100, clock=2100, power=750,
         fp8=2614.9, fp8_source="AMD Instinct MI300X datasheet: peak FP8 2,614.9 TFLOPS dense (5,229.8 with sparsity)"),
    _gpu("MI250X", 65536, 191.5, 191.5, 23.95, 100, 32,
         "AMD Instinct MI250X datasheet, per GCD (each of its two dies is a device of its own: half of 383 TFLOPs "
         "bf16, 47.9 fp32, 128 GB HBM2e at 3.2768 TB/s and 560 W; 110 of its 220 CUs at 1700 MHz): "
         "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html; peer link: an assumed 100 GB/s "
         "each way, the GCD's share of the package's 8 Infinity Fabric links", ("mi250x",), hbm=1638.4,
         arch="cdna2", units=110, boost=1700, clock=1700, power=280),
    _gpu("Gaudi2", 98304, 432, 432, None, 262.5, 32,
         "Intel Gaudi 2 (HL-225, 600 W, 96 GB HBM2e at 2.46 TB/s; 21 of its 24 100-GbE ports link the 8 cards of a "
         "server: 262.5 GB/s each way): https://docs.habana.ai/en/latest/Gaudi_Overview/Gaudi_Architecture.html; "
         "bf16 peak: 2 MMEs of 256 x 256 MACs at 1650 MHz (stas00/ml-engineering compute/accelerator/README.md); "
         "fp32: not published", ("hl-225", "gaudi2", "gaudi 2"), hbm=2460, arch="gaudi2", units=2, boost=1650,
         clock=1650, power=600),
    _gpu("Gaudi3", 131072, 1835, 459, 229, 525, 64,
         "Intel Gaudi 3 AI accelerator white paper (HL-325L OAM, 900 W, 128 GB HBM2e at 3.7 TB/s, 8 MMEs; 21 of its "
         "24 200-GbE ports link the 8 cards of a server: 525 GB/s each way): https://www.intel.com/content/www/us/"
         "en/content-details/817486/intel-gaudi-3-ai-accelerator-white-paper.html; its 1835 TFLOPs bf16 are at "
         "1750 MHz, the boards measured run their MMEs at 1600 (stas00/ml-engineering)",
         ("hl-325", "gaudi3", "gaudi 3"), hbm=3700, arch="gaudi3", units=8, boost=1750, clock=1750, power=900),
)}

#: CPU processes (gloo) as the planner sees them, for ``strategy="auto"`` on a machine without an accelerator.
#: Stated assumptions, not a datasheet: a few cores' bf16/fp32 matmul rate, the memory bandwidth one process of
#: a shared box gets, and gloo's loopback transfers; the memory is the process's share of RAM, set per job.
CPU = GpuSpec(name="cpu", memory_bytes=16 * 2**30, bf16_tflops=1.0, fp16_tflops=1.0, fp32_tflops=1.0,
              nvlink_gbs=None, pcie_gbs=5.0, memory_gbs=20.0, kind="cpu",
              source="CPU processes: assumed rates (about 1 TFLOP/s, 20 GB/s memory, 5 GB/s between processes)")

_SPEC = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(.+?)\s*$")


#: a board without a table row, planned from the user's memory and peak: its links as a PCIe Gen4 x16 card's
_UNLISTED_PCIE_GBS = 32.0


def board_for(name: str, *, memory_gib: float | None = None, peak_tflops: float | None = None) -> GpuSpec:
    """The table row for ``name`` (``lookup_gpu``), else, for a board the table lacks, one made of the user's
    figures: ``memory_gib`` (or an inventory's memory) and ``peak_tflops`` (every dtype's peak), its links a PCIe
    Gen4 x16 card's (``--intra-gbs`` for others) and its memory bandwidth unknown, as its ``source`` says. Without
    both figures, the table's ``PlanError`` naming what to give."""
    try:
        return lookup_gpu(name)
    except PlanError as err:
        if memory_gib is None or peak_tflops is None:
            missing = " and ".join(flag for flag, value in (("--gpu-memory-gib", memory_gib),
                                                           ("--peak-tflops", peak_tflops)) if value is None)
            raise PlanError(str(err).replace("(or give --gpu-memory-gib and --peak-tflops)",
                                             f"(or give {missing} for it)")) from None
    if memory_gib <= 0 or peak_tflops <= 0:
        raise PlanError(f"{name.strip()}: GPU memory and peak TFLOPs must be > 0, got {memory_gib:g} GiB and "
                        f"{peak_tflops:g}")
    return GpuSpec(name=name.strip(), memory_bytes=int(memory_gib * 2**30), bf16_tflops=peak_tflops,
                   fp16_tflops=peak_tflops, fp32_tflops=peak_tflops, nvlink_gbs=None, pcie_gbs=_UNLISTED_PCIE_GBS,
                   source=f"{name.strip()}: no table row; memory and peak given by the user, links assumed PCIe "
                          f"Gen4 x16 ({_UNLISTED_PCIE_GBS:g} GB/s), memory bandwidth unknown")


def _names_model(key: str, alias: str) -> bool:
    """``alias`` occurs in ``key`` as a whole model name: no digit or lower-case letter just before it, no digit
    just after (the regular expression ``(?<![0-9a-z])alias(?![0-9])``, without compiling one per alias when a
    plan starts)."""
    start = key.find(alias)
    while start >= 0:
        end = start + len(alias)
        if (start == 0 or key[start - 1] not in _DIGITS_LOWER) and (end == len(key) or key[end] not in _DIGITS):
            return True
        start = key.find(alias, start + 1)
    return False


_DIGITS = "0123456789"
_DIGITS_LOWER = _DIGITS + "abcdefghijklmnopqrstuvwxyz"


def lookup_gpu(name: str) -> GpuSpec:
    """The table row for ``name``: a short name (``H100-80GB``, any case) or a device name from NVML."""
    key = name.strip().lower()
    if key in GPUS:
        return GPUS[key]
    for spec in GPUS.values():  # device names from NVML/ROCm: "NVIDIA H100 80GB HBM3"
        # an alias is a whole model name in the device's: "nvidia a10" is not in "nvidia a100-sxm4-80gb", nor
        # "h200" in "gh200", nor "nvidia l4" in "nvidia l40"
        if any(_names_model(key, alias) for alias in spec.aliases):
            return spec
    close = [g.name for g in GPUS.values() if key.split("-")[0] and key.split("-")[0] in g.name.lower()]
    hint = f"did you mean {', '.join(close)}?" if close else "known: " + ", ".join(g.name for g in GPUS.values())
    raise PlanError(f"unknown accelerator {name!r}; {hint} (or give --gpu-memory-gib and --peak-tflops)")


@hashed_once
@dataclass(frozen=True, kw_only=True)
class Hardware:
    """The machine shape a plan is for: which GPU, how many per node, how many nodes, and their links."""

    gpu: GpuSpec
    """The accelerator (all GPUs of a job are assumed alike)."""
    gpus_per_node: int
    """Accelerators per node: the NVLink domain for tensor parallelism."""
    nodes: int = 1
    """Number of nodes."""
    intra: str = "nvlink"
    """Link between GPUs of one node: ``"nvlink"`` or ``"pcie"``."""
    intra_gbs: float | None = None
    """Override of the per-GPU intra-node bandwidth (GB/s, one direction); default from the table."""
    inter_gbps: float = 400.0
    """Inter-node network bandwidth per node, Gbit/s, all NICs together (a DGX H100 has 8 x 400)."""

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise PlanError(f"hardware needs >= 1 GPU per node and >= 1 node, got {self.gpus_per_node} x {self.nodes}")
        if self.intra not in ("nvlink", "pcie"):
            raise PlanError(f"intra-node link {self.intra!r} is not one of: nvlink, pcie")
        if self.intra == "nvlink" and self.gpu.nvlink_gbs is None and self.intra_gbs is None and self.gpus_per_node > 1:
            raise PlanError(f"{self.gpu.name} has no NVLink in the table; use --intra pcie (or give --intra-gbs)")
        if self.inter_gbps <= 0:
            raise PlanError(f"inter-node bandwidth must be > 0 Gbit/s, got {self.inter_gbps}")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def intra_bandwidth(self) -> float:
        """Bytes/s one GPU can send to its node's peers (one direction)."""
        if self.intra_gbs is not None:
            return self.intra_gbs * GB
        gbs = self.gpu.nvlink_gbs if self.intra == "nvlink" else self.gpu.pcie_gbs
        return float(gbs or self.gpu.pcie_gbs) * GB

    @property
    def inter_bandwidth(self) -> float:
        """Bytes/s one node can send to the others (all NICs, one direction)."""
        return self.inter_gbps * 1e9 / 8

    @property
    def host_bandwidth(self) -> float:
        """Bytes/s between one GPU and host memory (offload traffic)."""
        return self.gpu.pcie_gbs * GB

    def describe(self) -> str:
        """``8xH100-80GB (nvlink) x 2 nodes (400 Gbit/s between nodes)``; one GPU has no link to name."""
        nodes = f" x {self.nodes} nodes ({self.inter_gbps:g} Gbit/s between nodes)" if self.nodes > 1 else ""
        link = f" ({self.intra})" if self.gpus_per_node > 1 else ""
        return f"{self.gpus_per_node}x{self.gpu.name}{link}{nodes}"


def parse_hardware(text: str, *, nodes: int = 1, intra: str | None = None, intra_gbs: float | None = None,
                   inter_gbps: float = 400.0, memory_gib: float | None = None,
                   peak_tflops: float | None = None) -> Hardware:
    """``"8xH100-80GB"`` (count x table name; count defaults to 1) into a ``Hardware``.

    ``intra`` defaults to NVLink when the board has it, else PCIe. ``memory_gib`` / ``peak_tflops`` override
    the table (peak_tflops replaces every dtype's peak).
    """
    match = _SPEC.match(text or "")
    if not match or not match.group(2):
        raise PlanError(f"hardware {text!r} is not COUNTxGPU, e.g. '8xH100-80GB'")
    count = int(match.group(1) or 1)
    if count < 1:
        raise PlanError(f"hardware {text!r}: the GPU count must be >= 1")
    if match.group(2).lower() in ("cpu", "cpus"):
        raise PlanError(f"hardware {text!r}: convoy plan plans accelerators, not CPU processes; a run on CPU prints "
                        "its own plan in its step line ('planned ...': step 2's operators, counted as they ran, at "
                        "this CPU's measured rates)")
    gpu = override_gpu(board_for(match.group(2), memory_gib=memory_gib, peak_tflops=peak_tflops),
                       memory_gib=memory_gib, peak_tflops=peak_tflops)
    if intra is None:
        intra = "nvlink" if gpu.nvlink_gbs is not None else "pcie"
    return Hardware(gpu=gpu, gpus_per_node=count, nodes=nodes, intra=intra, intra_gbs=intra_gbs,
                    inter_gbps=inter_gbps)


def override_gpu(gpu: GpuSpec, *, memory_gib: float | None = None, peak_tflops: float | None = None) -> GpuSpec:
    """A copy of ``gpu`` with the user's memory and/or peak figures."""
    if memory_gib is not None:
        if memory_gib <= 0:
            raise PlanError(f"GPU memory must be > 0 GiB, got {memory_gib}")
        gpu = replace(gpu, memory_bytes=int(memory_gib * 2**30), source=gpu.source + "; memory given by the user")
    if peak_tflops is not None:
        if peak_tflops <= 0:
            raise PlanError(f"peak TFLOPs must be > 0, got {peak_tflops}")
        # the user's peak is what the board runs at: no power-limited clock lowers it; its fp8 peak keeps the
        # table's ratio to bf16
        fp8 = gpu.fp8_tflops * peak_tflops / gpu.bf16_tflops if gpu.fp8_tflops and gpu.bf16_tflops else None
        gpu = replace(gpu, bf16_tflops=peak_tflops, fp16_tflops=peak_tflops, fp32_tflops=peak_tflops, power_w=None,
                      fp8_tflops=fp8, source=gpu.source + "; peak given by the user")
    return gpu


def hardware_from_inventory(inventory: Any, *, nodes: int = 1, intra: str | None = None,
                            inter_gbps: float = 400.0, peak_tflops: float | None = None,
                            memory_gib: float | None = None) -> Hardware:
    """A ``Hardware`` from a ``convoy.devices`` inventory (or selection): its devices' name, memory, NVLink.

    Boards missing from the table still plan: their memory comes from the inventory (or ``memory_gib``) and their
    peak FLOPs must then be given (``peak_tflops``; ``PlanError`` says so).
    """
    devices = tuple(getattr(inventory, "devices", ()) or ())
    if not devices:
        raise PlanError("the inventory has no accelerators to plan for; describe the hardware instead, "
                        "e.g. --hardware 8xH100-80GB")
    names = {d.name for d in devices}
    if len(names) > 1:
        raise PlanError(f"the inventory mixes accelerators ({', '.join(sorted(names))}); the planner assumes "
                        "identical GPUs: select one kind (convoy select) or give --hardware")
    memory_mib = min(int(d.memory_total_mib) for d in devices)
    gpu = board_for(devices[0].name, memory_gib=memory_gib if memory_gib is not None else
                    memory_mib / 1024 if memory_mib > 0 else None, peak_tflops=peak_tflops)
    if memory_mib > 0:
        gpu = replace(gpu, memory_bytes=memory_mib * MiB)
    if intra is None:
        linked = len(devices) > 1 and all(len(getattr(d, "nvlink_peers", ()) or ()) > 0 for d in devices)
        intra = "nvlink" if linked and gpu.nvlink_gbs is not None else "pcie"
    return Hardware(gpu=gpu, gpus_per_node=len(devices), nodes=nodes, intra=intra, inter_gbps=inter_gbps)

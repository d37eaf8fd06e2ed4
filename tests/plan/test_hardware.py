"""The GPU table and machine descriptions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from convoy.errors import PlanError
from convoy.plan.architectures import ARCHITECTURES
from convoy.plan.hardware import GPUS, Hardware, hardware_from_inventory, lookup_gpu, parse_hardware
from convoy.plan.units import GB, MiB


def test_every_row_has_a_source_and_sane_numbers():
    for gpu in GPUS.values():
        assert gpu.source and gpu.memory_bytes > 8 * GB
        assert gpu.fp32_tflops is None or gpu.fp16_tflops >= gpu.fp32_tflops > 0
        assert gpu.arch in ARCHITECTURES, gpu.name
        if gpu.units is not None:  # the physics the compute model needs: units, clocks, power
            assert gpu.clock_mhz and gpu.power_w and (gpu.boost_mhz is None or gpu.boost_mhz >= gpu.clock_mhz)
            assert 0 < gpu.power_limited_mhz <= gpu.clock_mhz
        assert gpu.pcie_gbs in (16, 32, 64)
        # memory bandwidth: GDDR (an L4's 300 GB/s) to HBM3 (an MI300X's 5.3 TB/s), never the host link's
        assert 300 <= gpu.memory_gbs <= 8000 and gpu.memory_gbs > 4 * gpu.pcie_gbs


def _documented_rows() -> dict[str, list[str]]:
    """docs/planner.md's GPU table as board name -> its cells ("A100-80GB / A100-40GB" rows split in two)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    table = text[text.index("| GPU | memory (MiB)"):].split("\n\n")[0].splitlines()[2:]
    rows = {}
    for line in table:
        names, *cells = [c.strip() for c in line.strip("|").split("|")]
        for at, name in enumerate(re.sub(r" \(SXM4?\)", "", names).split(" / ")):
            rows[name] = [c.split(" / ")[at] if " / " in c else c for c in cells]
    return rows


def test_the_documented_table_is_the_code_table():
    rows = _documented_rows()
    assert set(rows) == {gpu.name for gpu in GPUS.values()}
    def number(cell):
        return None if cell == "–" else float(cell)

    for gpu in GPUS.values():
        memory, bf16, fp16, fp32, nvlink, pcie, bandwidth, units, boost, peak, limited, power = rows[gpu.name]
        assert int(memory) == gpu.memory_bytes // MiB, gpu.name
        assert number(bf16) == pytest.approx(gpu.bf16_tflops, abs=0.1), gpu.name
        assert number(fp16) == pytest.approx(gpu.fp16_tflops, abs=0.1), gpu.name
        assert number(fp32) == pytest.approx(gpu.fp32_tflops, abs=0.1), gpu.name
        assert number(nvlink) == gpu.nvlink_gbs, gpu.name
        assert (float(pcie), float(bandwidth)) == (gpu.pcie_gbs, gpu.memory_gbs), gpu.name
        assert number(units.split()[0]) == gpu.units, gpu.name
        assert (number(boost), number(peak), number(power)) == (gpu.boost_mhz, gpu.clock_mhz, gpu.power_w), gpu.name
        assert number(limited) == (round(gpu.power_limited_mhz) if gpu.power_limited_mhz else None), gpu.name


def test_parse_hardware_and_links():
    hw = parse_hardware("8xH100-80GB", nodes=2, inter_gbps=3200)
    assert (hw.world_size, hw.intra, hw.gpu.memory_bytes) == (16, "nvlink", 81559 * MiB)
    assert hw.intra_bandwidth == 450 * GB and hw.inter_bandwidth == 400 * GB
    assert hw.gpu.peak_flops("bf16") == pytest.approx(989.4e12)
    assert parse_hardware("4 x l40s").intra == "pcie"  # no NVLink on the board: PCIe by default
    assert parse_hardware("h100-80gb").gpus_per_node == 1
    custom = parse_hardware("2xA100-40GB", memory_gib=20, peak_tflops=100)
    assert custom.gpu.memory_bytes == 20 * 2**30 and custom.gpu.peak_flops("fp32") == 1e14


@pytest.mark.parametrize("text,word", [("8xB999", "unknown accelerator"), ("0xH100-80GB", "count"),
                                       ("", "COUNTxGPU")])
def test_bad_descriptions(text, word):
    with pytest.raises(PlanError, match=word):
        parse_hardware(text)


def test_bad_links_and_dtypes():
    with pytest.raises(PlanError, match="no NVLink"):
        parse_hardware("4xL4", intra="nvlink")
    with pytest.raises(PlanError, match="nvlink, pcie"):
        parse_hardware("4xH100-80GB", intra="infiniband")
    with pytest.raises(PlanError, match="no bf16"):
        lookup_gpu("V100-32GB").peak_flops("bf16")


def test_nvml_names_find_their_rows():
    assert lookup_gpu("NVIDIA H100 80GB HBM3").name == "H100-80GB"
    assert lookup_gpu("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert lookup_gpu("AMD Instinct MI300X").name == "MI300X"
    # PCIe boards (no NVLink) are not their SXM siblings, and a short alias is a whole model name, not a prefix
    names = {"NVIDIA A100 80GB PCIe": "A100-PCIE-80GB", "NVIDIA A100-PCIE-40GB": "A100-PCIE-40GB",
             "A100-SXM-80GB": "A100-80GB", "NVIDIA A100-SXM4-40GB": "A100-40GB", "NVIDIA H100 PCIe": "H100-PCIE",
             "NVIDIA L4": "L4", "NVIDIA L40S": "L40S", "NVIDIA A10": "A10", "NVIDIA H200": "H200-141GB",
             "NVIDIA H100 NVL": "H100-NVL", "NVIDIA A10G": "A10G", "NVIDIA B200": "B200",
             "AMD Instinct MI250X": "MI250X", "HL-225": "Gaudi2", "HL-325L": "Gaudi3"}
    assert {name: lookup_gpu(name).name for name in names} == names
    assert lookup_gpu("NVIDIA A100 80GB PCIe").nvlink_gbs is None and lookup_gpu("A100-80GB").nvlink_gbs == 300
    for unknown in ("NVIDIA L40", "NVIDIA GH200 480GB"):  # once read as an L4 and an H200
        with pytest.raises(PlanError, match="unknown accelerator"):
            lookup_gpu(unknown)


def test_hardware_from_inventory_files(inventory_path):
    from convoy.devices.inventory import load_inventory

    hw = hardware_from_inventory(load_inventory(inventory_path("8xh100_nvswitch")))
    assert (hw.gpu.name, hw.gpus_per_node, hw.intra) == ("H100-80GB", 8, "nvlink")
    with pytest.raises(PlanError, match="mixes accelerators"):
        hardware_from_inventory(load_inventory(inventory_path("4_mixed_pcie")))


def test_hardware_validation():
    with pytest.raises(PlanError, match=">= 1"):
        Hardware(gpu=lookup_gpu("H100-80GB"), gpus_per_node=0)
    with pytest.raises(PlanError, match="inter-node"):
        parse_hardware("8xH100-80GB", inter_gbps=0)


def test_the_hardware_line_names_a_link_only_between_gpus():
    from convoy.plan.hardware import parse_hardware

    assert parse_hardware("1xH100-80GB").describe() == "1xH100-80GB"  # it said "(nvlink)"
    assert parse_hardware("8xH100-80GB").describe() == "8xH100-80GB (nvlink)"
    assert parse_hardware("8xL40S", nodes=2).describe() == "8xL40S (pcie) x 2 nodes (400 Gbit/s between nodes)"


def test_a_board_the_table_lacks_plans_with_the_users_memory_and_peak(inventory_path, capsys):
    """The issue's case: `convoy devices` and the error said "give --gpu-memory-gib and --peak-tflops" for an MI210,
    and giving them still exited 2 "unknown accelerator". Now --hardware with both, or an inventory (its memory)
    with --peak-tflops, plans; a figure missing is named."""
    from convoy.cli.main import main
    from convoy.devices.inventory import load_inventory

    hw = parse_hardware("4xMI210", memory_gib=64, peak_tflops=181)
    assert (hw.gpu.name, hw.gpu.memory_bytes, hw.gpu.bf16_tflops, hw.intra) == ("MI210", 64 * 2**30, 181, "pcie")
    assert "no table row; memory and peak given by the user" in hw.gpu.source
    with pytest.raises(PlanError, match=r"unknown accelerator 'MI210'.*\(or give --gpu-memory-gib for it\)"):
        parse_hardware("4xMI210", peak_tflops=181)
    inventory = load_inventory(inventory_path("amd_4gpu_xgmi_pairs"))
    from_inventory = hardware_from_inventory(inventory, peak_tflops=181)
    assert (from_inventory.gpu.name, from_inventory.gpus_per_node) == ("AMD Instinct MI210", 4)
    assert from_inventory.gpu.memory_bytes == min(d.memory_total_mib for d in inventory.devices) * MiB
    with pytest.raises(PlanError, match=r"\(or give --peak-tflops for it\)"):
        hardware_from_inventory(inventory)
    assert main(["plan", "--params", "7e9", "--hardware", "4xMI210", "--gpu-memory-gib", "64", "--peak-tflops",
                 "181"]) == 0
    assert "run it:  convoy launch --nnodes 1 --nproc-per-node 4 " in capsys.readouterr().out
    assert main(["plan", "--params", "7e9", "--inventory", str(inventory_path("intel_max1550")), "--peak-tflops",
                 "419"]) == 0
    assert "hardware  " in capsys.readouterr().out

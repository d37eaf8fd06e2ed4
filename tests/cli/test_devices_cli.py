"""``convoy devices``, ``convoy select``, ``convoy run``: output, exit codes, signals, leases under
contention, flag snapshots, and that none of them imports torch."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from convoy.cli.main import COMMANDS, _command_parser, main
from convoy.devices.inventory import load_inventory


def _convoy(*argv, env=None, timeout=30, **kw):
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "convoy", *argv], capture_output=True, text=True, env=full,
                          timeout=timeout, **kw)


@pytest.fixture
def lease_dir(tmp_path, monkeypatch):
    path = tmp_path / "leases"
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(path))
    return path


def test_devices_table(inventory_path, capsys, lease_dir):
    assert main(["devices", "--inventory", str(inventory_path("2_busy_exclusive"))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["IDX", "NAME", "MEMORY", "USED/TOTAL", "UTIL", "PROCS", "LINK", "STATE", "AS"]
    assert out[1].split() == ["0", "NVIDIA", "A100-PCIE-40GB", "38211/40960", "MiB", "97%", "2", "-", "busy", "cuda:0"]
    assert out[2].split()[-2:] == ["busy", "cuda:1"]


def test_devices_table_islands_mask_and_mig(inventory_path, capsys, monkeypatch, lease_dir):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,5")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert main(["devices", "--inventory", str(inventory_path("8gpu_two_islands"))]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:9]]
    assert [r[-3] for r in rows] == ["A"] * 4 + ["B"] * 4
    assert [r[-1] for r in rows] == ["hidden"] * 5 + ["cuda:1", "cuda:0", "hidden"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    assert main(["devices", "--inventory", str(inventory_path("a100_mig"))]) == 0
    out = capsys.readouterr().out
    assert "MIG 3g.40gb MIG-" in out and out.count("cuda:") == 10


def test_devices_json_is_the_inventory_format(inventory_path, capsys):
    path = inventory_path("8xh100_nvswitch")
    assert main(["devices", "--json", "--inventory", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"] == json.loads(load_inventory(path).to_json())["devices"]
    assert data["devices"][0]["numa_node"] == 0


def test_devices_without_accelerators(capsys, monkeypatch, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text('{"devices": []}')
    assert main(["devices", "--inventory", str(empty)]) == 0
    assert "no accelerators found" in capsys.readouterr().out


@pytest.mark.parametrize("fmt, expected", [
    ("env", "export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0"),
    ("index", "2,0"),
])
def test_select_formats(inventory_path, capsys, fmt, expected):
    assert main(["select", "2,0", "--inventory", str(inventory_path("4_mixed_pcie")), "--format", fmt]) == 0
    assert capsys.readouterr().out.strip() == expected


def test_select_uuid_json_and_explain(inventory_path, capsys):
    path = str(inventory_path("4_mixed_pcie"))
    inv = load_inventory(path)
    assert main(["select", "2", "--order", "fastest", "--inventory", path, "--format", "uuid"]) == 0
    assert capsys.readouterr().out.strip() == f"{inv.devices[1].uuid},{inv.devices[3].uuid}"
    assert main(["select", "1", "--inventory", path, "--format", "json", "--explain"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["indices"] == [0] and data["vendor"] == "nvidia" and data["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert "took GPU 0 (NVIDIA RTX A4000) -> cuda:0" in captured.err


def test_select_eval_in_bash(inventory_path):
    script = (f"eval $({sys.executable} -m convoy select 1 --free --min-free-memory 20GiB "
              f"--inventory {inventory_path('4_mixed_pcie')} --format env) && "
              f"echo \"[$CUDA_VISIBLE_DEVICES] [$CUDA_DEVICE_ORDER]\" && "
              f"eval $({sys.executable} -m convoy select 0 --format env) && echo \"[${{CUDA_VISIBLE_DEVICES-unset}}]\"")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[1] [PCI_BUS_ID]", "[]"]


@pytest.mark.parametrize("argv, fragment, code", [
    (["select", "1,9"], "convoy: devices='1,9': index 9 is out of range; 4 devices are available (0-3)", 2),
    (["select", "true"], "convoy: devices='true': cannot parse 'true'", 2),
    (["select", "1", "--min-free-memory", "lots"], "convoy: cannot read memory amount 'lots'", 2),
    (["select", "1", "--order", "best"], "argument --order: invalid choice: 'best'", 2),
    (["select", "5", "--free", "--min-free-memory", "20GiB"],
     "convoy: devices='5': asks for 5 devices but 4 devices are available (0-3)", 2),
    (["select", "3", "--min-free-memory", "20GiB"],
     "convoy: devices='3': needs 3 device(s) but only 2 of 4 visible pass the filters (GPU 0: only 16126 MiB free", 1),
    (["run", "--devices", "7", "--", "true"], "convoy: devices='7': asks for 7 devices", 2),
    (["run", "--devices", "1", "--wait", "soon", "--", "true"], "convoy: cannot read duration 'soon'", 2),
    (["run", "--devices", "1"], "no command to run; write e.g.: convoy run --devices 1 -- python train.py", 2),
])
def test_errors_are_one_line(inventory_path, argv, fragment, code, lease_dir):
    proc = _convoy(*argv, env={"CONVOY_INVENTORY": str(inventory_path("4_mixed_pcie"))})
    assert proc.returncode == code, proc.stderr
    assert fragment in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_blank_device_request_is_one_line_everywhere_and_an_empty_one_means_no_accelerator(
        inventory_path, capsys, monkeypatch, lease_dir):
    """``--devices "$N "`` with N unset was read as no accelerator (select, run) or as 'auto' (launch), and
    launch took every GPU for '' (its "not given"): a blank request is one line, "" is no accelerator."""
    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory_path("4_mixed_pcie")))
    for argv in (["select", " "], ["run", "--devices", "\t", "--", "true"],
                 ["launch", "--dry-run", "--devices", " ", __file__]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("convoy: devices=") and "is blank" in err, err
    assert main(["select", ""]) == 0 and capsys.readouterr().out == "export CUDA_VISIBLE_DEVICES=''\n"
    assert main(["launch", "--dry-run", "--devices", "", __file__]) == 0
    out = capsys.readouterr().out
    assert "devices:    cpu, backend gloo" in out, out


def test_inventory_errors_are_one_line(tmp_path):
    proc = _convoy("devices", "--inventory", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and proc.stderr.startswith("convoy: inventory file") and "Traceback" not in proc.stderr


def test_run_sets_visibility_and_returns_the_exit_code(inventory_path, lease_dir):
    show = "echo \"$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER\"; exit 7"
    proc = _convoy("run", "--devices", "3,1", "--inventory", str(inventory_path("4_mixed_pcie")), "--",
                   "sh", "-c", show)
    assert proc.returncode == 7 and proc.stdout == "3,1|PCI_BUS_ID\n"
    proc = _convoy("run", "--devices", "0", "--", "sh", "-c", "echo \"[${CUDA_VISIBLE_DEVICES-unset}]\"")
    assert proc.returncode == 0 and proc.stdout == "[]\n"  # an empty request hides every GPU
    proc = _convoy("run", "--devices", "0", "--", "sh", "-c", "kill -9 $$")
    assert proc.returncode == 128 + signal.SIGKILL
    proc = _convoy("run", "--devices", "0", "--", "no-such-command-xyz")
    assert proc.returncode == 127 and "command not found: 'no-such-command-xyz'" in proc.stderr


def test_run_forwards_signals(tmp_path):
    child = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))
        print("ready", flush=True)
        time.sleep(30)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "convoy", "run", "--devices", "0", "--", sys.executable, "-c",
                             child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 42
    finally:
        proc.kill()
        proc.wait()


def test_concurrent_runs_get_distinct_gpus(inventory_path, tmp_path):
    """Six `convoy run --devices 1 --free` at once on 4 GPUs: four run on distinct GPUs, two fail naming
    the holders; a waiting job gets the GPU of a job killed by SIGKILL at once."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CONVOY_LEASE_DIR": str(tmp_path / "leases"),
           "CONVOY_INVENTORY": str(inventory_path("4_mixed_pcie"))}
    job = ["sh", "-c", "echo \"gpu=$CUDA_VISIBLE_DEVICES $$\"; exec sleep 60"]

    def start(*extra):
        return subprocess.Popen([sys.executable, "-m", "convoy", "run", "--devices", "1", "--free", *extra, "--",
                                 *job], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)

    procs = [start() for _ in range(6)]
    waiter = None
    try:
        running, failed = {}, []
        for proc in procs:
            line = proc.stdout.readline()
            if line:
                gpu, command = line.split()
                running[gpu] = (proc, int(command))
            else:
                assert proc.wait(timeout=30) == 1
                failed.append(proc.stderr.read())
        assert sorted(running) == ["gpu=0", "gpu=1", "gpu=2", "gpu=3"]
        assert len(failed) == 2
        for err in failed:
            assert err.startswith("convoy: devices='1': needs 1 device(s) but only 0 of 4 visible pass the filters")
            assert "GPU 0: leased by pid" in err and err.count("\n") == 1
        waiter = start("--wait", "30")
        time.sleep(0.5)
        assert waiter.poll() is None  # still waiting
        victim, command = running["gpu=2"]
        os.killpg(command, signal.SIGKILL)  # the command's process group: convoy run then ends, releasing the GPU
        victim.wait(timeout=10)
        start_wait = time.monotonic()
        assert waiter.stdout.readline().split()[0] == "gpu=2"
        assert time.monotonic() - start_wait < 25  # within its --wait 30, not at its end
    finally:
        for proc in [*procs, *([waiter] if waiter else [])]:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)  # convoy run stops its command's group
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
            proc.stderr.close()


TORCH_FREE = textwrap.dedent("""
    import contextlib, io, sys
    import convoy.devices
    assert "torch" not in sys.modules, "import convoy.devices"
    from convoy.cli.main import main
    with contextlib.redirect_stdout(io.StringIO()):
        for argv in (["--help"], ["devices"], ["devices", "--json"], ["select", "1", "--free"],
                     ["run", "--devices", "0", "--", "true"], ["run", "--help"]):
            try:
                main(argv)
            except SystemExit:
                pass
            assert "torch" not in sys.modules, argv
    print("torch-free")
""")


def test_device_commands_never_import_torch(inventory_path, tmp_path):
    proc = subprocess.run([sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")),
                               "CONVOY_LEASE_DIR": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.strip() == "torch-free", proc.stderr


def _flags(name):
    parser = _command_parser(name, importlib.import_module(COMMANDS[name][0]))
    return sorted(s for action in parser._actions for s in action.option_strings)


def test_flag_snapshots():
    # Changing these lists changes convoy's command line: say so in the release notes.
    filters = ["--exclude", "--free", "--inventory", "--max-utilization", "--min-free-memory", "--order"]
    assert _flags("devices") == ["--debug", "--help", "--inventory", "--json", "-h"]
    assert _flags("select") == sorted(["--debug", "--help", "-h", "--format", "--explain", *filters])
    assert _flags("run") == sorted(["--debug", "--help", "-h", "--devices", "--wait", "--no-lease", "--explain",
                                    "--shutdown-timeout", "--shutdown_timeout", *filters])


def test_devices_names_the_planner_row_each_board_matched(inventory_path):
    """``convoy devices`` ends with the board-table row each device name matched (what ``convoy plan`` assumes of
    it), or says that no row did."""
    from convoy.cli.devices import planner_rows
    from convoy.devices.inventory import load_inventory

    lines = planner_rows(load_inventory(inventory_path("4_mixed_pcie")).devices)
    assert "planner: Tesla T4 is the T4 (40 SMs, 1590 MHz under 70 W, 320 GB/s) row" in lines
    assert any(line.startswith("planner: NVIDIA RTX A4000 has no row") for line in lines)
    assert planner_rows(load_inventory(inventory_path("gaudi2")).devices) == [
        "planner: HL-225 is the Gaudi2 (2 MMEs, 1650 MHz under 600 W, 2460 GB/s) row"]

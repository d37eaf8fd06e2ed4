"""On 2 processes, prepared dataloaders hand out a one-process DataLoader's samples in its order, shuffled
included, so training matches one process (scripts/data_order.py reports; plain PyTorch is the reference)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from tests.distributed import run_script

SCRIPT = Path(__file__).parent / "scripts" / "data_order.py"
pytestmark = pytest.mark.slow


def _script():
    spec = importlib.util.spec_from_file_location("data_order", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(loader: DataLoader, epochs: int = 2) -> list[list[int]]:
    return [[i for batch in loader for i in batch.reshape(-1).tolist()] for _ in range(epochs)]


def _trained(script) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.linspace(-1, 1, 24).unsqueeze(1)
    data = torch.utils.data.TensorDataset(xs, 3 * xs + 1)
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5))
    for _ in range(2):
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return [p.item() for p in model.parameters()]


def test_two_processes_read_the_one_process_order(tmp_path):
    out = tmp_path / "result.json"
    result = run_script(SCRIPT, nproc=2, args=["--out", str(out)])
    assert result.returncode == 0, result.output[-4000:]
    got = json.loads(out.read_text())
    m = _script()
    assert got["generator"] == _flat(DataLoader(m.Indices(), batch_size=m.B, shuffle=True,
                                                generator=torch.Generator().manual_seed(7)))
    torch.manual_seed(5)
    assert got["global_seed"] == _flat(DataLoader(m.Indices(), batch_size=m.B, shuffle=True))
    sampler = BatchSampler(RandomSampler(m.Indices(), generator=torch.Generator().manual_seed(9)), m.B, False)
    assert got["batch_sampler_as_sampler"] == _flat(DataLoader(m.Indices(), sampler=sampler, batch_size=None))
    assert got["stream"] == got["dispatch_stream"] == [list(range(m.N))] * 2
    torch.manual_seed(5)
    assert got["dispatch_global_seed"] == _flat(DataLoader(m.Indices(), batch_size=m.B, shuffle=True))
    assert got["no_batch_size"] == [list(range(m.N))]
    assert got["uneven_batch_sampler"] == list(range(14))
    # use_seedable_sampler: epoch e is shuffled with data_seed + e, whatever the number of processes
    assert got["seedable"] == [list(RandomSampler(m.Indices(), generator=torch.Generator().manual_seed(11 + e)))
                               for e in (3, 4)]
    assert got["trained"] == pytest.approx(_trained(m), abs=1e-6)

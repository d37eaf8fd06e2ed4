"""The Accelerator on one CUDA device, run by tests/gpu/test_accelerator_gpu.py in a fresh process.

    python accelerator_cuda.py precision fp16        # fp32 | bf16 | fp16: device, dtypes, scaler, a skipped step
    python accelerator_cuda.py strategy zero3        # a strategy at world size 1 against a plain loop
    python accelerator_cuda.py resume DIR            # save_state/load_state on the GPU resume to identical weights
    python accelerator_cuda.py save_model DIR        # safetensors shards loaded back on the CPU
    python accelerator_cuda.py comm_hook bf16        # a DDP communication hook on NCCL (bf16 needs it)

Prints ``CHECK <name> ok`` per check (``CHECK device cuda:0`` first); a failed check raises (exit 1). Without
CUDA it runs the same checks on the CPU, which is how it was rehearsed on a machine without a GPU.
"""

import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from convoy import Accelerator  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)
DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
torch.backends.cuda.matmul.allow_tf32 = False  # the plain loop and the strategies compute alike
torch.backends.cudnn.allow_tf32 = False


def ok(name: str) -> None:
    print(f"CHECK {name} ok", flush=True)


def data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def precision(mode: str) -> None:
    acc = Accelerator(mixed_precision=mode)
    assert acc.device == DEVICE, acc.device
    print(f"CHECK device {acc.device} ok", flush=True)
    net = model()
    net, opt, loader = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), DataLoader(data(), 8))
    assert all(p.device == DEVICE for p in net.parameters())
    losses = []
    for _ in range(5):
        for x, y in loader:
            assert x.device == DEVICE and y.device == DEVICE
            loss = F.mse_loss(net(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    assert sum(losses[-4:]) < 0.9 * sum(losses[:4]), losses  # the last epoch against the first
    ok("trains")
    out = net(next(iter(loader))[0])
    assert out.dtype == torch.float32, out.dtype  # outputs handed back in fp32
    with acc.autocast():
        inner = torch.randn(4, 4, device=acc.device) @ torch.randn(4, 4, device=acc.device)
    expected = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]
    assert inner.dtype == expected, inner.dtype
    ok("autocast dtype")
    if mode == "fp16":
        assert isinstance(acc.scaler, torch.amp.GradScaler) and acc.scaler.is_enabled()
        before = [p.detach().clone() for p in net.parameters()]
        x, y = next(iter(loader))
        acc.backward(F.mse_loss(net(x), y) * float("inf"))
        opt.step()
        opt.zero_grad()
        assert acc.optimizer_step_was_skipped
        assert all(torch.equal(b, p) for b, p in zip(before, net.parameters()))
        acc.backward(F.mse_loss(net(x), y))
        opt.step()
        assert not acc.optimizer_step_was_skipped
        ok("fp16 skips an inf step")
    else:
        assert acc.scaler is None
    acc.end_training()


def plain_loop(steps: int) -> list[torch.Tensor]:
    net = model().to(DEVICE)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for x, y in DataLoader(data(), 8):
        if steps == 0:
            break
        steps -= 1
        loss = F.mse_loss(net(x.to(DEVICE)), y.to(DEVICE))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().cpu() for p in net.parameters()]


def strategy(name: str) -> None:
    expected = plain_loop(4)
    options = {"loss_fn": F.mse_loss} if name == "pp" else {}
    acc = Accelerator(strategy=name, strategy_options=options)
    print(f"CHECK device {acc.device} ok", flush=True)
    net = acc.prepare(model())
    opt = acc.prepare(torch.optim.AdamW(net.parameters(), lr=1e-2))
    loader = acc.prepare(DataLoader(data(), 8))
    for x, y in loader:
        assert x.device == DEVICE
        loss = net(x, target=y) if name == "pp" else F.mse_loss(net(x), y)  # pp's loop: forward+backward
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    state = acc.get_state_dict(net)
    got = [state[k].cpu() for k in ("0.weight", "0.bias", "2.weight", "2.bias")]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.float(), e, rtol=1e-5, atol=1e-6)
    ok(f"{name} matches the plain loop")
    acc.end_training()


def resume(directory: str) -> None:
    def run(batches):
        for x, y in batches:
            acc.backward(F.mse_loss(net(x), y))
            opt.step()
            opt.zero_grad()

    acc = Accelerator()
    print(f"CHECK device {acc.device} ok", flush=True)
    net = acc.prepare(model())
    opt = acc.prepare(torch.optim.AdamW(net.parameters(), lr=1e-2))
    batches = [(x.to(acc.device), y.to(acc.device)) for x, y in DataLoader(data(), 4)]
    run(batches[:3])
    acc.save_state(directory)
    run(batches[3:6])  # what the resumed run must repeat exactly
    straight = [p.detach().cpu().clone() for p in net.parameters()]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)  # far from the checkpoint
    acc.load_state(directory)
    assert next(iter(opt.optimizer.state.values()))["exp_avg"].device == DEVICE  # optimizer state on the GPU
    run(batches[3:6])
    for a, b in zip(straight, (p.detach().cpu() for p in net.parameters())):
        assert torch.equal(a, b), (a - b).abs().max()
    ok("resume to identical parameters")
    acc.end_training()


def save_model(directory: str) -> None:
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    acc = Accelerator()
    print(f"CHECK device {acc.device} ok", flush=True)
    net = acc.prepare(model())
    acc.save_model(net, directory, max_shard_size="2KB")
    index = json.loads((Path(directory) / "model.safetensors.index.json").read_text())
    loaded = {}
    for name in sorted(set(index["weight_map"].values())):
        loaded.update(load_file(Path(directory) / name))  # on the CPU
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fresh.load_state_dict(loaded)
    for k, v in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v.cpu()), k
    ok("safetensors shards load back")


def comm_hook(name: str) -> None:
    from convoy import DistributedDataParallelKwargs

    expected = plain_loop(4)
    acc = Accelerator(strategy="ddp", kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=name)])
    print(f"CHECK device {acc.device} ok", flush=True)
    net = acc.prepare(model())
    assert len(net._comm_hooks) == 1, net._comm_hooks  # registered on the DDP wrapper
    opt = acc.prepare(torch.optim.AdamW(net.parameters(), lr=1e-2))
    for x, y in acc.prepare(DataLoader(data(), 8)):
        acc.backward(F.mse_loss(net(x), y))
        opt.step()
        opt.zero_grad()
    state = acc.get_state_dict(net)
    got = [state[k].cpu() for k in ("0.weight", "0.bias", "2.weight", "2.bias")]
    for e, g in zip(expected, got):  # gradients rounded to 16 bits on their way through the all-reduce
        torch.testing.assert_close(g.float(), e, rtol=1e-2, atol=1e-2)
    ok(f"{name} hook trains as the plain loop")
    acc.end_training()


if __name__ == "__main__":
    what, arg = sys.argv[1], sys.argv[2]
    {"precision": precision, "strategy": strategy, "resume": resume, "save_model": save_model,
     "comm_hook": comm_hook}[what](arg)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of the process group's threads (pytorch/pytorch#179291)

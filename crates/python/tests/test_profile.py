"""The PyTorch profiler and the profile format: round trips on LeNet and ResNet-20, the order
in which gradients become ready, reading without torch, the command line, and the Rust
simulator reading what Python wrote."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from syncopate import profile_format  # noqa: E402
from syncopate.torch.profile import profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
BINARY = ROOT / "target" / "debug" / "syncopate"


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(256, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class BasicBlock(nn.Module):
    """CIFAR ResNet block; where the shape changes, the shortcut is a 1x1 convolution and a
    batch norm, computed after the main path as torchvision does. One ReLU module is called
    twice, as in torchvision's blocks."""

    def __init__(self, inp, out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = None
        if stride != 1 or inp != out:
            self.shortcut = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.shortcut is not None:
            x = self.shortcut(x)
        return self.relu(y + x)


class ResNet20(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, inp = [], 16
        for out, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                blocks.append(BasicBlock(inp, out, stride if i == 0 else 1))
                inp = out
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def cifar_batch(n=8):
    torch.manual_seed(0)
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))


def grad_ready_layers(model, batch, profiled):
    """The profile's layer index of each parameter, in the order autograd makes the
    gradients ready (consecutive repeats of a layer merged)."""
    owner = {}
    for index, layer in enumerate(profiled.layers):
        module = model.get_submodule(layer.name)
        for p in module.parameters(recurse=False):
            owner[id(p)] = index
    order = []
    handles = [
        p.register_hook(lambda g, i=owner[id(p)]: order.append(i)) for p in model.parameters()
    ]
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    for h in handles:
        h.remove()
    return [i for n, i in enumerate(order) if n == 0 or order[n - 1] != i]


@pytest.mark.parametrize("make,shape,count", [(LeNet, (1, 28, 28), 44_426), (ResNet20, None, 272_474)])
def test_round_trip_keys_sizes_order_and_count(tmp_path, make, shape, count):
    torch.manual_seed(1)
    model = make()
    batch = (torch.randn(8, *shape), torch.randint(0, 10, (8,))) if shape else cifar_batch()
    assert sum(p.numel() for p in model.parameters()) == count
    path = tmp_path / "m.graph.txt"
    written = profile(model, batch, path, steps=2, warmup=1)
    read = profile_format.read(path)
    assert read == written
    assert (read.batch_size, read.param_count, read.name) == (8, count, make.__name__.lower())
    sizes = [p.numel() for p in model.parameters()]
    assert [n for _, n in read.keys()] == sizes
    assert [n for _, n in read.backward_keys()] == sizes[::-1]
    # The layers' order is the reverse of the order autograd makes their gradients ready.
    with_keys = [i for i, layer in enumerate(read.layers) if layer.tensors]
    assert grad_ready_layers(model, batch, read) == with_keys[::-1]
    assert all(layer.forward_ms >= 0 and layer.backward_ms >= 0 for layer in read.layers)
    assert read.forward_ms > 0 and read.backward_ms > 0
    if make is ResNet20:
        relus = [layer for layer in read.layers if layer.name.endswith(".relu")]
        assert len(relus) == 9 and all(not r.tensors for r in relus)
        assert sum(r.forward_ms for r in relus) > 0  # parameter-free layers carry time


def test_profiling_leaves_the_model_as_it_was(tmp_path):
    model = ResNet20().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile(model, cifar_batch(), tmp_path / "r.graph.txt", steps=1, warmup=0)
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_input_only_batch_and_custom_loss(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    calls = []

    def loss_fn(out):
        calls.append(out.shape)
        return out.pow(2).mean()

    got = profile(model, torch.randn(5, 4), tmp_path / "s.graph.txt", steps=3, warmup=1, loss_fn=loss_fn)
    assert len(calls) == 4 and got.batch_size == 5
    assert [layer.name for layer in got.layers] == ["0", "1", "2"]
    assert got.keys() == [(0, 12), (0, 3), (2, 6), (2, 2)]


def test_reads_without_torch(tmp_path):
    path = tmp_path / "l.graph.txt"
    profile(LeNet(), (torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))), path, steps=1, warmup=0)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # makes `import torch` fail
        "from syncopate import profile_format\n"
        f"p = profile_format.read({str(path)!r})\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "print(len(p.keys()), p.param_count)\n"
    )
    # The package as this interpreter imports it (the wheel scripts/test.sh installed).
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["10", "44426"]


def test_command_line(tmp_path, monkeypatch, capsys):
    from syncopate import cli

    (tmp_path / "mymodels.py").write_text(
        "import torch.nn as nn\n"
        "def small():\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))\n"
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "small.graph.txt"
    args = ["mymodels:small", "--batch-size", "6", "--input-shape", "3x8x8", "--out", str(out), "--steps", "1"]
    assert cli.main(args) == 0
    got = profile_format.read(out)
    assert (got.name, got.batch_size, got.param_count) == ("small", 6, 112 + 725)
    assert "4 parameter tensors" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["mymodels:nothing", "--out", str(out)])
    with pytest.raises(SystemExit):
        cli.main(["mymodels:small", "--out", str(out)])  # no --input-shape


@pytest.mark.skipif(not BINARY.exists(), reason=f"{BINARY} not built (cargo build -p syncopate)")
def test_rust_simulator_reads_the_profile(tmp_path):
    model = ResNet20()
    path = tmp_path / "resnet20.graph.txt"
    written = profile(model, cifar_batch(), path, steps=1, warmup=0)

    def simulate(strategy):
        report = tmp_path / f"{strategy}.json"
        cmd = [str(BINARY), "simulate", "--model", f"profile:{path}", "--strategy", strategy,
               "--workers", "2", "--steps", "2", "--json", str(report)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(report.read_text())

    report = simulate("allreduce")
    assert report["config"]["batch"] == 8
    assert report["mean_step_seconds"] * 1e3 >= 0.9 * (written.forward_ms + written.backward_ms)
    # One key per parameter tensor, as the DLCP report counts them.
    assert len(simulate("dlcp")["realised_loss_per_key"]) == len(written.keys()) == 65

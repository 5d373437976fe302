"""ResNet-20 (He et al.'s CIFAR network: three stages of three basic blocks, 16/32/64
channels, 0.27 M parameters) with PyTorch DDP, its buckets all-reduced by Gloo or by
Syncopate's ring (`--backend`). It trains on MNIST padded to 32x32 (one channel), or on
synthetic images with `--synthetic`:

    torchrun --nproc_per_node 2 examples/torch/resnet20_ddp.py --backend syncopate
"""

import torch
from torch import nn

from ddp_common import parse_args, run


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.short is None else self.short(x)))


def resnet20(in_channels=1, classes=10):
    torch.manual_seed(0)
    layers = [nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)]
    return nn.Sequential(*layers)


if __name__ == "__main__":
    run(parse_args("ResNet-20 with DDP", default_steps=50), resnet20(), size=32)

"""LeNet-5 on MNIST with PyTorch DDP, its buckets all-reduced by Gloo or by Syncopate's
ring (`--backend`):

    torchrun --nproc_per_node 2 examples/torch/lenet_ddp.py --backend syncopate
"""

import torch
from torch import nn

from ddp_common import parse_args, run


def lenet():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )


if __name__ == "__main__":
    run(parse_args("LeNet-5 on MNIST with DDP", default_steps=200), lenet(), size=28)

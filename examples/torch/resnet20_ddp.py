"""ResNet-20 (He et al.'s CIFAR network as Syncopate's model zoo builds it, 269,722
parameters) with PyTorch DDP, its buckets all-reduced by Gloo or by Syncopate's ring
(`--backend`). It trains on MNIST padded to 32x32 and repeated over 3 channels, or on
synthetic images with `--synthetic`:

    torchrun --nproc_per_node 2 examples/torch/resnet20_ddp.py --backend syncopate
"""

from ddp_common import parse_args, run

if __name__ == "__main__":
    run(parse_args("ResNet-20 with DDP", default_steps=50), "resnet20")

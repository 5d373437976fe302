"""LeNet on MNIST (PyTorch's MNIST example without dropout, the reference baselines' and
Syncopate's LeNet) with PyTorch DDP, its buckets all-reduced by Gloo or by Syncopate's ring
(`--backend`):

    torchrun --nproc_per_node 2 examples/torch/lenet_ddp.py --backend syncopate
"""

from ddp_common import parse_args, run

if __name__ == "__main__":
    run(parse_args("LeNet on MNIST with DDP", default_steps=200), "lenet")

"""A ~110M-parameter transformer language model (GPT-2 small's shape) on random tokens with
PyTorch DDP, its buckets all-reduced by Gloo or by Syncopate's ring (`--backend`); `--dtype
bf16` trains (and all-reduces) in bfloat16, `--device cuda` on the GPU:

    torchrun --nproc_per_node 2 examples/torch/transformer_ddp.py --backend syncopate --batch 2
"""

from ddp_common import parse_args, run

if __name__ == "__main__":
    run(parse_args("A 110M-parameter transformer with DDP", default_steps=10), "transformer")

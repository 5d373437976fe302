"""Syncopate for torch models: the DDP communication hook, DiLoCo and local SGD, the
local-SGD averager and the profile import.

    state = syncopate.torch.SyncopateState()      # after init_process_group("gloo")
    ddp_model.register_comm_hook(state, syncopate.torch.allreduce_hook)
    opt = syncopate.torch.DiLoCo(model, torch.optim.AdamW(model.parameters()), every=16)
    syncopate.torch.profile(model, example_batch, "model.graph.txt")
"""

from .diloco import DiLoCo, LocalSGD
from .hook import LocalSgdAverager, SyncopateState, allreduce_hook
from .profile import profile

__all__ = [
    "DiLoCo",
    "LocalSGD",
    "LocalSgdAverager",
    "SyncopateState",
    "allreduce_hook",
    "profile",
]

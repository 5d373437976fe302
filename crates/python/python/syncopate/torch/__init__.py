"""Syncopate for torch models: the DDP communication hook, the local-SGD averager and the
profile import.

    state = syncopate.torch.SyncopateState()      # after init_process_group("gloo")
    ddp_model.register_comm_hook(state, syncopate.torch.allreduce_hook)
    syncopate.torch.profile(model, example_batch, "model.graph.txt")
"""

from .hook import LocalSgdAverager, SyncopateState, allreduce_hook
from .profile import profile

__all__ = ["LocalSgdAverager", "SyncopateState", "allreduce_hook", "profile"]

"""Syncopate for torch models: the DDP communication hook, the local-SGD averager and the
profile import.

    state = syncopate.torch.SyncopateState()      # after init_process_group("gloo")
    ddp_model.register_comm_hook(state, syncopate.torch.allreduce_hook)
"""

from .hook import LocalSgdAverager, SyncopateState, allreduce_hook

__all__ = ["LocalSgdAverager", "SyncopateState", "allreduce_hook"]

try:
    from .profile import profile  # noqa: F401
except ModuleNotFoundError as e:  # a build without the profile import
    if e.name != f"{__name__}.profile":
        raise
else:
    __all__.append("profile")

"""Syncopate for PyTorch users.

``syncopate.torch`` holds what needs torch: the DDP communication hook
(``SyncopateState``, ``allreduce_hook``), the local-SGD averager (``LocalSgdAverager``) and
the profile import. This package itself imports without torch: nothing here imports it.
"""

from ._native import __version__, new_token

__all__ = ["__version__", "new_token"]

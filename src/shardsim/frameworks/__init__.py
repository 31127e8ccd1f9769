"""The frameworks people train with: their launch configurations read as plans, and written back.

:mod:`.megatron`: Megatron-LM's parallelism flags (:func:`~.megatron.from_megatron`,
:func:`~.megatron.to_megatron`). A model's Hugging Face ``config.json`` is
:func:`shardsim.models.from_hf_config`'s.
"""

from __future__ import annotations

from .megatron import Launch, from_megatron, to_megatron

__all__ = ["Launch", "from_megatron", "to_megatron"]

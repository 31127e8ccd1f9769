"""The frameworks people train with: their launch configurations read as plans, and written back.

:mod:`.megatron`: Megatron-LM's parallelism flags (:func:`~.megatron.from_megatron`,
:func:`~.megatron.to_megatron`); :mod:`.deepspeed`: DeepSpeed's JSON configuration
(:func:`~.deepspeed.from_deepspeed`, :func:`~.deepspeed.to_deepspeed`); :mod:`.torchtitan`:
torchtitan's TOML job configuration (:func:`~.torchtitan.from_torchtitan`,
:func:`~.torchtitan.to_torchtitan`); each gives a
:class:`~.launch.Launch`, the plan with its batch. A model's Hugging Face ``config.json`` is
:func:`shardsim.models.from_hf_config`'s.
"""

from __future__ import annotations

from .deepspeed import from_deepspeed, to_deepspeed
from .launch import Launch
from .megatron import from_megatron, to_megatron
from .torchtitan import from_torchtitan, to_torchtitan

__all__ = [
    "Launch",
    "from_deepspeed",
    "from_megatron",
    "from_torchtitan",
    "to_deepspeed",
    "to_megatron",
    "to_torchtitan",
]

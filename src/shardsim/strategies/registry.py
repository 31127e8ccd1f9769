"""The registry of schemes by name: the seed's four, the ZeRO stages, sequence, pipeline and
expert parallelism, and any scheme a user registers.

>>> names()[:4], get("fsdp").name
(['ddp', 'fsdp', 'tp', 'fsdp_tp'], 'fsdp')
"""

from __future__ import annotations

from ..errors import ShardingError
from . import ddp, ep, fsdp, fsdp_tp, pp, tp, tp_sp, zero
from .base import Scheme

_REGISTRY: dict[str, Scheme] = {m.SCHEME.name: m.SCHEME for m in (ddp, fsdp, tp, fsdp_tp)}


def names() -> list[str]:
    """The registered schemes, in the seed's order."""
    return list(_REGISTRY)


def get(name: str) -> Scheme:
    """The scheme called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ShardingError(f"unknown scheme {name!r}; choose one of {names()}") from None


def register(scheme: Scheme) -> Scheme:
    """Add a scheme to the registry (it then runs through :func:`run_strategy` and the CLI)."""
    _REGISTRY[scheme.name] = scheme
    return scheme


for _zero in zero.SCHEMES:  # ZeRO stages 1 and 2 next to ddp (stage 0); zero3 is fsdp
    register(_zero)

for _scheme in (*tp_sp.SCHEMES, *pp.SCHEMES, *ep.SCHEMES):  # sequence, pipeline, expert parallelism
    register(_scheme)


__all__ = ["get", "names", "register"]

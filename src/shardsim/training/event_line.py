"""A layer program's events at another microbatch size, read off the line through two traced ones.

A layer program at ``b`` sequences per microbatch is the same program at every ``b``: the
same steps in the same order on the same values, only longer along the batch. Every size an
event carries (bytes sent and received, FLOPs, HBM traffic, the array's bytes, each dimension
of its operands' local shapes) is an affine function of ``b``: an activation's grows with it,
a weight's collective does not. So two traced microbatch sizes fix every event at a third
(:func:`~shardsim.training.traced.trained_step` reads steps so, their peaks replayed from the
ledger's journal, :mod:`shardsim.journal`).

:func:`on_line` builds the third only where that reading is exact: the two programs have the
same steps on the same values (:func:`same_program`) and every size lands on a whole number;
else it returns ``None`` and the caller traces. A test holds the events it builds to the
traced ones.

>>> from dataclasses import replace
>>> from shardsim.tracing import Event
>>> one = Event(0, "all_gather", ("X",), "x", ("[B, D_X]",), "[B, D]", "forward", sent_bytes=8, local_shapes=((2, 4),))
>>> two = replace(one, sent_bytes=16, local_shapes=((4, 4),))
>>> four = on_line((1, [one]), (2, [two]), 4)
>>> four[0].sent_bytes, four[0].local_shapes
(32, ((8, 4),))
>>> on_line((1, [one]), (3, [replace(two, sent_bytes=15)]), 2) is None  # 8 + 7 / 2 is no whole number
True
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from ..journal import sizes_on_line
from ..tracing import Event

#: The event fields that carry sizes (affine in the microbatch); every other field names the step.
SIZES = ("sent_bytes", "received_bytes", "flops", "hbm_bytes", "array_bytes")


def same_program(a: Sequence[Event], b: Sequence[Event]) -> bool:
    """Whether two traces run the same steps on the same values: every field but the sizes
    equal, the operands of the same ranks, and each event reading the values the other's
    reads (value ids, which differ between traces, compared by their first appearance).

    >>> from dataclasses import replace
    >>> from shardsim.tracing import Event
    >>> y = Event(0, "matmul", (), "y", ("[B, D]",), "[B, F]", "forward", inputs=(7, 8), output=9)
    >>> z = Event(1, "matmul", (), "z", ("[B, F]",), "[B, D]", "forward", inputs=(9, 8), output=10)
    >>> moved = [replace(e, inputs=tuple(i + 10 for i in e.inputs), output=e.output + 10) for e in (y, z)]
    >>> same_program([y, z], moved), same_program([y, z], [y, replace(z, inputs=(7, 8))])  # z reads x, not y
    (True, False)
    """
    if len(a) != len(b):
        return False
    ids_a: dict[int, int] = {}
    ids_b: dict[int, int] = {}
    for x, y in zip(a, b):
        if (x.index, x.op, x.axes, x.label, x.before, x.after, x.phase, x.group_size, x.dtype) != (
            y.index,
            y.op,
            y.axes,
            y.label,
            y.before,
            y.after,
            y.phase,
            y.group_size,
            y.dtype,
        ) or (x.where, x.layer, x.item, x.kernel) != (y.where, y.layer, y.item, y.kernel):
            return False
        if [len(s) for s in x.local_shapes] != [len(s) for s in y.local_shapes]:
            return False
        for u, v in zip((*x.inputs, x.output), (*y.inputs, y.output)):
            if ids_a.setdefault(u, len(ids_a)) != ids_b.setdefault(v, len(ids_b)):
                return False
        if len(x.inputs) != len(y.inputs):
            return False
    return True


def on_line(first: tuple[int, Sequence[Event]], second: tuple[int, Sequence[Event]], b: int) -> list[Event] | None:
    """The events at microbatch ``b`` from the traces ``(b1, events)`` and ``(b2, events)``
    of one program (module doc), or None where the line does not give them exactly."""
    (b1, one), (b2, two) = first, second
    if b1 == b2 or not same_program(one, two):
        return None

    def sizes(e: Event) -> list[int]:
        return [*(getattr(e, f) for f in SIZES), *(d for shape in e.local_shapes for d in shape)]

    flat = [sizes(x) for x in one]
    first_sizes = np.fromiter(itertools.chain.from_iterable(flat), np.int64)
    second_sizes = np.fromiter(itertools.chain.from_iterable(map(sizes, two)), np.int64)
    at = sizes_on_line((b1, first_sizes), (b2, second_sizes), b)
    if at is None or (at < 0).any():  # off the whole numbers, or below zero: not this line
        return None
    out, k = [], 0
    for x, mine in zip(one, flat):
        values, k = at[k : k + len(mine)].tolist(), k + len(mine)
        if values == mine:  # a size the batch does not change (a weight's)
            out.append(x)
            continue
        dims = iter(values[len(SIZES) :])
        shapes = tuple(tuple(next(dims) for _ in s) for s in x.local_shapes)
        out.append(_with(x, dict(zip(SIZES, values[: len(SIZES)]), local_shapes=shapes)))
    return out


def _with(e: Event, sizes: dict[str, object]) -> Event:
    """``dataclasses.replace(e, **sizes)`` without its checks: a step has thousands of events
    and every field here is one :class:`Event` already had."""
    out = object.__new__(Event)
    out.__dict__.update(e.__dict__, **sizes)
    return out


__all__ = ["SIZES", "on_line", "same_program"]

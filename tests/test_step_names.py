"""Step tables name an unnamed value after the step that made it, never a bare ``?``.

The expected names are written by hand from the program below: the all_gather of an unnamed
``In @ W_in`` is ``matmul(In, W_in)``, and a matmul reading it names it the same way.
"""

from __future__ import annotations

import numpy as np

import shardsim
from shardsim.cli import step_rows
from shardsim.pictures import step_labels, trace_table


def _program() -> shardsim.Trace:
    mesh = shardsim.Mesh(X=2)
    x = shardsim.shard(np.ones((4, 2), np.float32), mesh, "B_X D", label="In")
    w_in = shardsim.shard(np.ones((2, 4), np.float32), mesh, "D F", label="W_in")
    w_out = shardsim.shard(np.ones((4, 2), np.float32), mesh, "F D", label="W_out")
    u = shardsim.shard(np.ones((4, 2), np.float32), mesh, "B_X D")  # an unnamed input
    with shardsim.trace() as t:
        h = x @ w_in  # not named
        g = shardsim.all_gather(h, "X")
        _ = g @ w_out
        _ = shardsim.all_gather(u, "X")
    return t


def test_an_unnamed_value_is_named_after_its_step() -> None:
    t = _program()
    assert step_labels(t.events) == {
        0: "In @ W_in",
        1: "matmul(In, W_in)",
        2: "matmul(In, W_in) @ W_out",
        3: "?",  # no traced step made it: nothing to name it by
    }


def test_the_demo_table_and_the_trace_table_print_the_names() -> None:
    t = _program()
    rows = step_rows(t.events)
    assert [r[3] for r in rows[1:]] == ["In @ W_in", "matmul(In, W_in)", "matmul(In, W_in) @ W_out", "?"]
    table = trace_table(t)
    assert "all_gather  X     matmul(In, W_in)" in table and "matmul(In, W_in) @ W_out" in table


def test_named_steps_keep_their_labels() -> None:
    import shardsim.strategies as s

    r = s.run_strategy("fsdp", shardsim.Mesh(X=2), shardsim.mlp.init(4, 8), np.ones((2, 4)), np.ones((2, 4)))
    assert [step_labels(r.trace.events)[e.index] for e in r.trace] == [e.label for e in r.trace]

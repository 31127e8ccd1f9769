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


def test_backward_matmuls_name_their_transposes_everywhere() -> None:
    """fsdp.py computes ``h.T @ dout``, ``dout @ w_out.T``, ``x.T @ dh``, ``dh @ w_in.T``: the
    trace, its table and the exported chrome trace say so, and every ``.T`` operand is read in
    its value's first layout with the last two dimensions swapped."""
    import shardsim.strategies as s

    r = s.run_strategy("fsdp", shardsim.Mesh(X=2), shardsim.mlp.init(4, 8), np.ones((2, 4)), np.ones((2, 4)))
    matmuls = [e for e in r.trace if e.op == "matmul" and e.phase == "backward"]
    labels = ["H_pre.T @ dOut", "dOut @ W_out.T", "In.T @ dH", "dH @ W_in.T"]
    assert [e.label for e in matmuls] == labels
    first: dict[int, str] = {}  # the layout each value had when a step first read or made it
    for e in r.trace:
        for uid, before in zip(e.inputs, e.before):
            first.setdefault(uid, before)
        first.setdefault(e.output, e.after)
    for e in matmuls:
        for part, uid, before in zip(e.label.split(" @ "), e.inputs, e.before):
            natural = shardsim.Layout.parse(first[uid]).dims
            swapped = natural[:-2] + natural[-2:][::-1]
            assert shardsim.Layout.parse(before).dims == (swapped if part.endswith(".T") else natural), e
    assert all(label in trace_table(r.trace) for label in labels)
    names = {ev["name"] for ev in r.trace.to_chrome_trace()["traceEvents"] if ev.get("ph") == "X"}
    assert {f"matmul {label}" for label in labels} <= names


def test_transposing_twice_gives_back_the_name() -> None:
    mesh = shardsim.Mesh(X=2)
    w = shardsim.shard(np.ones((4, 2)), mesh, "D F_X", label="W")
    assert w.T.label == "W.T" and w.T.T.label == "W" and w.label == "W"
    assert shardsim.ops.transpose(w, label="V").label == "V"  # an explicit label wins

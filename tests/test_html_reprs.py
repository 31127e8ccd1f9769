"""Notebook reprs are real HTML tables holding the text tables' cells, numbers right-aligned."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest

import shardsim
from shardsim._format import fmt_bytes, fmt_si, fmt_time, table_html, table_text
from shardsim.cost import estimate, timeline_of

VOID = {"br", "img", "hr", "meta", "input"}


class _Table(HTMLParser):
    """Checks tags balance and collects each row's cells as (tag, right-aligned, text)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.rows: list[list[tuple[str, bool, str]]] = []
        self.cell: tuple[str, bool] | None = None
        self.text = ""
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            return
        self.stack.append(tag)
        self.tables += tag == "table"
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self.cell, self.text = (tag, "text-align:right" in (dict(attrs).get("style") or "")), ""

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:] or 'nothing'}"
        self.stack.pop()
        if tag in ("td", "th"):
            assert self.cell is not None
            self.rows[-1].append((*self.cell, self.text))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.text += data


def parse(html: str) -> _Table:
    p = _Table()
    p.feed(html)
    p.close()
    assert not p.stack, f"unclosed tags {p.stack}"
    assert p.tables >= 1 and "<pre>" not in html
    return p


def assert_same_table(html: str, text: str, numbers: set[str]) -> None:
    """The HTML's cells are the text table's, header in <th>, the columns ``numbers`` right-aligned
    in both renderings."""
    p = parse(html)
    head, *body = p.rows
    assert all(tag == "th" for tag, _, _ in head) and all(tag == "td" for r in body for tag, _, _ in r)
    labels = [c for _, _, c in head]
    lines = text.splitlines()
    assert lines[0].split() == " ".join(labels).split()
    assert len(lines) == len(p.rows)
    right = [label in numbers for label in labels]
    ends, pos = [], 0  # where each header label ends in the text
    for label in labels:
        pos = lines[0].index(label, pos) + len(label)
        ends.append(pos)
    assert [r for _, r, _ in head] == right
    for line, row in zip(lines[1:], body):
        assert [r for _, r, _ in row] == right
        # each cell's text sits in the text line, in order, and numbers end where their header ends
        pos = 0
        for (_, r, cell), end in zip(row, ends):
            at = line.index(cell, pos)
            if r:
                assert at + len(cell) == end, (cell, line)
            pos = at + len(cell)


def _traced() -> tuple[shardsim.Trace, shardsim.Mesh]:
    mesh = shardsim.Mesh(X=2, Y=2)
    w = shardsim.shard(np.ones((8, 8), np.float32), mesh, "D_X F", label="W<in>", category="params")
    x = shardsim.shard(np.ones((4, 8), np.float32), mesh, "B_Y D", label="In")
    with shardsim.trace() as t:
        full = shardsim.all_gather(w, "X")
        x @ full
    return t, mesh


def test_trace_repr_is_the_trace_table() -> None:
    t, _ = _traced()
    html = t._repr_html_()
    assert_same_table(html, str(t), {"#", "sent/chip", "flops/chip"})
    cells = [c for r in parse(html).rows for _, _, c in r]
    assert "W<in>" in cells and "W&lt;in&gt;" in html  # labels escaped, read back unchanged
    gather, matmul = parse(html).rows[1:]
    assert gather[6][2] == fmt_bytes(8 * 8 * 4 // 2)  # each chip sends its half of the 256 B W
    assert matmul[7][2] == f"{2 * 2 * 8 * 8:,}"  # (2 x 8) @ (8 x 8) per chip: 256 FLOPs


def test_memory_repr_is_the_ledger_table() -> None:
    _, mesh = _traced()
    html = mesh.memory._repr_html_()
    text = str(mesh.memory)
    assert_same_table(html, text, {"params (peak)", "activations (peak)", "total live", "total peak"})
    head, *body = parse(html).rows
    assert [r[0][2] for r in body] == [mesh.chip_name(c) for c in mesh.chips()]
    params = [c for _, _, c in head].index("params (peak)")
    # W's half (128 B of 8 x 8 float32) and its all_gathered copy (256 B), both params, live at once
    assert all(r[params][2] == fmt_bytes(128 + 256) for r in body)


def test_estimate_repr_lists_the_summary_figures() -> None:
    e = estimate("fsdp", shardsim.Mesh(X=8), "h100", 8 * 4096, 8192, 32768, layers=2)
    p = parse(e._repr_html_())
    head, *body = p.rows
    assert [c for _, _, c in head] == ["quantity", "value"]
    assert [(q, v) for (_, _, q), (_, _, v) in body] == e.figures()
    assert all(right and not left for (_, left, _), (_, right, _) in body)
    summary = e.summary()
    assert f"step {body[0][1][2]}" in summary and f"MFU {dict(e.figures())['MFU']}" in summary
    assert dict(e.figures())["step"] == f"{e.step_s * 1e3:.4g} ms"


def test_timeline_repr_is_its_table() -> None:
    mesh = shardsim.Mesh(X=4)
    w = shardsim.shard(shardsim.ShapeDtype((8192, 8192), "bfloat16"), mesh, "D_X F")
    with shardsim.trace() as t:
        full = shardsim.all_gather(w, "X")
        full @ full
    tl = timeline_of(t, "tpu-v5p", mesh)
    assert_same_table(tl._repr_html_(), tl.table(), {"bars", "time", "exposed"})
    rows = {r[1][2]: r for r in parse(tl._repr_html_()).rows[1:]}
    assert rows["comm X"][3][2] == fmt_time(tl.comm_s) and rows["compute"][3][2] == fmt_time(tl.compute_s)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0 s"), (1.5, "1.5 s"), (0.001, "1 ms"), (2.5e-4, "250 µs"), (1e-6, "1 µs")],
)
def test_fmt_time(value: float, text: str) -> None:
    assert fmt_time(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(999, "999 FLOP"), (1000, "1 kFLOP"), (989.4e12, "989 TFLOP"), (1.2e18, "1.2 EFLOP")],
)
def test_fmt_si(value: float, text: str) -> None:
    assert fmt_si(value, "FLOP") == text


def test_table_text_and_html_agree_on_alignment() -> None:
    rows = [("name", "n"), ("a", "1"), ("bbb", "1,024")]
    assert table_text(rows, right={1}).splitlines() == ["name      n", "a         1", "bbb   1,024"]
    assert_same_table(table_html(rows, right={1}), table_text(rows, right={1}), {"n"})


def test_captions_sit_left_above_their_table() -> None:
    """A centred caption wraps into a narrow column over a narrow table (seen in the rendered tour)."""
    _, mesh = _traced()
    html = mesh.memory._repr_html_()
    assert html.startswith(f'<table><caption style="text-align:left">memory of {mesh!r}</caption><thead>'), html[:99]

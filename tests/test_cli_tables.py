"""The command line's tables read like every other table of the library: numbers right-aligned,
bytes in binary units, the figures those of the run.

Expected figures are hand-derived: ``shardsim train`` fits a 2-block MLP with D=16, F=32
(2 x 2 x 16 x 32 = 2,048 float32 parameters, 8 KiB), so ddp's chip holds params, grads and
Adam's two moments: 4 x 8 KiB = 32.0 KiB; zero3 over 4 chips holds a quarter: 8.0 KiB.
"""

from __future__ import annotations

import re

from shardsim import cli

BYTES = re.compile(r"^\d+(\.\d)? (B|KiB|MiB|GiB)$")


def _block(out: str, header_start: str) -> list[str]:
    """The lines of the table whose header line starts with ``header_start``, up to a blank line."""
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.lstrip().startswith(header_start))
    block = []
    for line in lines[i:]:
        if not line.strip():
            break
        block.append(line)
    return block


def _right_edges(block: list[str], column: str) -> set[int]:
    """Where the cells of the header's ``column`` end on each line (right-aligned: one place)."""
    end = block[0].index(column) + len(column)
    return {len(line[:end].rstrip()) if len(line) >= end else -1 for line in block}


def test_train_tables_use_binary_bytes_and_right_aligned_numbers(capsys) -> None:
    assert cli.main(["train", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    memory = _block(out, "scheme   stage")
    head = memory[0].split()
    rows = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in memory[1:]}
    for name, cells in rows.items():
        assert all(BYTES.match(c) for c in cells[2:]), (name, cells)
    model_state = head.index("model")  # "model state": two words in the header, one cell in a row
    assert rows["ddp"][model_state] == "32.0 KiB" and rows["zero3"][model_state] == "8.0 KiB"
    assert rows["ddp"][model_state + 1] == rows["ddp"][model_state]  # the closed form agrees
    for column in ("params", "optimizer", "sent/step"):
        assert len(_right_edges(memory, column)) == 1, column
    losses = _block(out, "scheme    mesh")
    assert len(_right_edges(losses, "step 1")) == len(_right_edges(losses, "step 2")) == 1


def test_demo_tables_right_align_bytes_and_flops(capsys) -> None:
    assert cli.main(["demo", "--scheme", "fsdp_tp"]) == 0
    out = capsys.readouterr().out
    steps = _block(out, "#  step")
    for column in ("#", "sent/chip", "FLOPs/chip"):
        assert len(_right_edges(steps, column)) == 1, column
    summary = _block(out, "scheme   mesh")[:2]  # the header and fsdp_tp's row
    assert len(_right_edges(summary, "peak/chip")) == 1
    assert all(BYTES.match(c) for c in re.split(r"\s{2,}", summary[1].strip())[2:5])

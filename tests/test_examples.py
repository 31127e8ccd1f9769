"""Every example script runs, prints what it promises, and the notebook executes top to bottom."""

from __future__ import annotations

import base64
import doctest
import importlib.util
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from shardsim.memory import fmt_bytes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECKED = {"seed_fsdp_tp.py", "compare_schemes.py", "build_tour.py", "render_html.py"}  # run by the tests below


def test_every_example_runs() -> None:
    """Scripts with no test of their own below at least run without an error."""
    assert all((EXAMPLES / name).exists() for name in CHECKED) and (EXAMPLES / "tour.ipynb").exists()
    for path in sorted(EXAMPLES.glob("*.py")):
        if path.name not in CHECKED:
            run_example(path.name)


def test_seed_fsdp_tp_walks_the_six_steps() -> None:
    out = run_example("seed_fsdp_tp.py")
    titles = re.findall(r"^(\d)\. (.+)$", out, re.M)
    assert [t[0] for t in titles] == ["1", "2", "3", "4", "5", "6"]
    assert titles[0][1] == "AllGather Y (activations)" and titles[5][1] == "ReduceScatter Y (output)"
    # the seed's starting layout, then each token whole on both Y-chips of its track after step 1
    assert "(X0,Y0): token 0, d_model[0:2]   (X0,Y1): token 0, d_model[2:4]" in out
    step1 = out.split("1. AllGather Y (activations)", 1)[1].split("\n\n", 1)[0]
    assert "(X0,Y0): token 0, d_model[0:4]   (X0,Y1): token 0, d_model[0:4]" in step1
    assert "values on (X0,Y1): [[0.0, 1.0, 2.0, 3.0]]" in step1
    step5 = out.split("5. matmul 2", 1)[1].split("\n\n", 1)[0]
    assert "[B_X, D]{U_Y}" in step5 and "(partial sum: Y1's share)" in step5
    assert "Gradients dIn, dW_in, dW_out match the single-device MLP." in out


def test_compare_schemes_table_is_the_closed_forms() -> None:
    out = run_example("compare_schemes.py", "--tokens", "4096", "--chips", "2x4")
    B, X, Y, s = 4096, 2, 4, 2
    n = X * Y
    sent = out.split("Bytes sent per chip", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert len(sent) == 5
    for line in sent:
        words = line.split()  # d_model, d_ff, then "30.0 MiB"-style cells of two words each
        D, F = int(words[0]), int(words[1])
        cells = [f"{number} {unit}" for number, unit in zip(words[2::2], words[3::2])]
        ring = Fraction(n - 1, n)  # the 1-D schemes put all n chips on one axis
        want = {
            "ddp": 4 * ring * D * F * s,
            "fsdp": 6 * ring * D * F * s,
            "tp": 4 * ring * B * D * s,
            "fsdp_tp": 5 * Fraction(Y - 1, Y) * B * D * s / X + 6 * Fraction(X - 1, X) * D * F * s / Y,
        }
        assert cells == [fmt_bytes(int(v)) for v in want.values()], line


def test_compare_schemes_doctest() -> None:
    module = load("compare_schemes.py")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 1 and result.failed == 0


# -- the notebook --------------------------------------------------------------------------------
def test_notebook_is_the_generated_one(tmp_path) -> None:
    nbformat = pytest.importorskip("nbformat")
    run_example("build_tour.py", "--no-execute", "--output", str(tmp_path / "tour.ipynb"))
    fresh = nbformat.read(str(tmp_path / "tour.ipynb"), as_version=4)
    stored = nbformat.read(str(EXAMPLES / "tour.ipynb"), as_version=4)
    assert [(c.cell_type, c.source) for c in stored.cells] == [(c.cell_type, c.source) for c in fresh.cells], (
        "examples/tour.ipynb is out of date: run python examples/build_tour.py"
    )


def _kernel_available() -> bool:
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return False
    return "python3" in KernelSpecManager().find_kernel_specs() or importlib.util.find_spec("ipykernel") is not None


def test_notebook_executes_top_to_bottom(monkeypatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if not _kernel_available():
        pytest.skip("no Jupyter kernel: pip install ipykernel (in the test extra) to execute the notebook")
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])  # the kernel imports this checkout's shardsim
    nb = nbformat.read(str(EXAMPLES / "tour.ipynb"), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}
    ).execute()
    html = [
        "".join(o["data"]["text/html"])
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "text/html" in o.get("data", {})
    ]
    text = "".join("".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert any("In[B_X, D_Y]" in h and "B[0:1] D[2:4]" in h for h in html)  # the sharded input, as a grid
    assert any("reduce_scatter" in h and "sent/chip" in h for h in html)  # a trace
    assert any("params (peak)" in h for h in html)  # the memory ledger
    assert not any("<pre>" in h for h in html)  # tables are HTML tables, not fixed-width text
    assert any("<th" in h and "MFU" in h for h in html)  # the estimate
    assert any("exposed</th>" in h for h in html)  # the time line's table
    assert "W_in[D_X, F_Y]" in text and "D[2:4] F[4:8]" in text  # ss.show's layout picture
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 2 and all(base64.b64decode(p)[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)  # time line, crossover
    assert re.findall(r"^(\w+)\s+Mesh.*; (PASS|FAIL)$", text, re.M) == [
        ("ddp", "PASS"),
        ("fsdp", "PASS"),
        ("tp", "PASS"),
        ("fsdp_tp", "PASS"),
    ]


def test_render_html_writes_the_pages(tmp_path) -> None:
    """The HTML pages hold the notebook's tables and figures; the PNGs need Chromium, absent here: a message."""
    out = run_example("render_html.py", "--out", str(tmp_path), "--chromium", str(tmp_path / "no-chromium"))
    assert "no Chromium at" in out and not list(tmp_path.glob("*.png"))
    tour = (tmp_path / "tour.html").read_text()
    assert tour.count("<img src='data:image/png;base64,") == 2 and "params (peak)" in tour
    # the markdown cells are rendered: headings, bold steps, numbered lists, no raw markup left
    assert "<h1>A tour of shardsim" in tour and "<li><b>AllGather Y</b> (activations)" in tour
    assert "## " not in tour and "<li>" in tour
    reprs = (tmp_path / "reprs.html").read_text()
    assert reprs.count("<table>") == 4 and "reduce_scatter" in reprs and "MFU" in reprs and "<pre>" not in reprs

"""Render the executed tour notebook and the notebook reprs to HTML, and to PNG with headless Chromium.

Writes ``tour.html`` (every cell of ``examples/tour.ipynb`` with its stored outputs: HTML tables,
PNG figures, printed text) and ``reprs.html`` (the HTML reprs of a trace, a memory ledger, a
cost estimate and its time line), then screenshots each to ``tour.png`` / ``reprs.png`` with
``chromium --headless --no-sandbox --disable-gpu --screenshot`` where Chromium is installed
(Debian/Ubuntu: ``apt-get install chromium``); without it the HTML is still written and the
script says so.

Run:  python examples/render_html.py --out docs/img   (after python examples/build_tour.py)
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import warnings
from pathlib import Path

import numpy as np

import shardsim as ss
from shardsim.cost import estimate

HERE = Path(__file__).resolve().parent
STYLE = """<style>
body { font-family: sans-serif; margin: 24px; max-width: 1200px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { padding: 2px 10px; border-bottom: 1px solid #ddd; }
th { background: #f4f4f4; }
pre { background: #f8f8f8; padding: 8px; font-size: 12px; }
.md { margin: 12px 0; max-width: 800px; }
code { background: #f4f4f4; padding: 0 3px; }
caption { font-weight: bold; padding: 4px 0; }
</style>"""


def page(title: str, body: str) -> str:
    """A standalone HTML document."""
    head = f"<meta charset='utf-8'><title>{html.escape(title)}</title>{STYLE}"
    return f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>"


def markdown_html(source: str) -> str:
    """A markdown cell as HTML: headings, paragraphs, numbered lines, ``**bold**`` and ``code``
    (what the tour's cells use; no markdown library needed)."""

    def inline(text: str) -> str:
        text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
        return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)

    parts = []
    for block in source.strip().split("\n\n"):
        heading = re.match(r"(#{1,4}) (.*)", block)
        if heading and "\n" not in block:
            level = len(heading.group(1))
            parts.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
        elif re.match(r"\d+\. ", block):
            items = re.split(r"\n(?=\d+\. )", block)
            parts.append("<ol>" + "".join(f"<li>{inline(i.split('. ', 1)[1])}</li>" for i in items) + "</ol>")
        else:
            parts.append(f"<p>{inline(block)}</p>")
    return "<div class='md'>" + "".join(parts) + "</div>"


def notebook_html(path: Path) -> str:
    """The cells of an executed notebook and their stored outputs, as one HTML page (no nbconvert needed)."""
    nb = json.loads(path.read_text())
    parts = []
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            parts.append(markdown_html(source))
            continue
        parts.append(f"<pre>{html.escape(source)}</pre>")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                parts.append(f"<img src='data:image/png;base64,{''.join(data['image/png']).strip()}'>")
            elif "text/html" in data:
                parts.append("".join(data["text/html"]))
            elif "text" in out or "text/plain" in data:
                parts.append(f"<pre>{html.escape(''.join(out.get('text') or data['text/plain']))}</pre>")
    return page(path.stem, "".join(parts))


def reprs_html() -> str:
    """The notebook reprs of a traced FSDP+TP step, its mesh's memory, and a cost estimate with its time line."""
    from shardsim import mlp

    params = mlp.init(d_model=4, d_ff=8, seed=0)
    tokens = np.arange(8, dtype=np.float32).reshape(2, 4)
    run = ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=2), params, tokens, np.ones_like(tokens))
    w = ss.shard(params["w_in"], ss.Mesh(X=2, Y=2), "[D_X, F_Y]", label="W_in", category="params")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # preset chips without measured curves: ideal rates here
        e = estimate("fsdp_tp", ss.Mesh(X=64, Y=4), "tpu-v5p", 256 * 2048, 8192, 32768, layers=2, efficiency="ideal")
    shown = [
        ("Trace: FSDP+TP forward and backward", run.trace),
        ("Memory ledger: W_in on a 2x2 mesh", w.mesh.memory),
        ("Estimate", e),
        ("Time line", e.timeline),
    ]
    body = "".join(f"<h2>{html.escape(title)}</h2>{obj._repr_html_()}" for title, obj in shown)
    return page("shardsim notebook reprs", body)


def screenshot(chromium: Path, source: Path, png: Path, size: tuple[int, int]) -> None:
    """Headless Chromium's screenshot of ``source`` at ``size`` (width, height) pixels."""
    subprocess.run(
        [
            str(chromium),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={png}",
            f"--window-size={size[0]},{size[1]}",
            source.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    _trim(png)


def _trim(png: Path) -> None:
    """Cut the blank page below the content (the window is sized for the longest page), when
    Pillow is there (matplotlib brings it); else keep the whole screenshot."""
    try:
        from PIL import Image, ImageChops
    except ImportError:
        return
    with Image.open(png) as im:
        page = im.convert("RGB")
    box = ImageChops.difference(page, Image.new("RGB", page.size, "white")).getbbox()
    if box is not None and box[3] + 24 < page.height:
        page.crop((0, 0, page.width, box[3] + 24)).save(png, optimize=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE.parent / "docs" / "img", help="folder for the HTML and PNG files")
    p.add_argument("--notebook", type=Path, default=HERE / "tour.ipynb", help="the executed notebook")
    p.add_argument("--chromium", type=Path, default=Path("/usr/bin/chromium"), help="the Chromium binary")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pages = {
        "tour": (notebook_html(args.notebook), (1200, 9000)),
        "reprs": (reprs_html(), (1200, 1400)),
    }
    for name, (text, _) in pages.items():
        (args.out / f"{name}.html").write_text(text)
        print(f"wrote {args.out / name}.html")
    if not args.chromium.exists():
        print(f"no Chromium at {args.chromium}: skipping the PNGs (install chromium, or pass --chromium PATH)")
        return
    for name, (_, size) in pages.items():
        screenshot(args.chromium, args.out / f"{name}.html", args.out / f"{name}.png", size)
        print(f"wrote {args.out / name}.png")


if __name__ == "__main__":
    main()

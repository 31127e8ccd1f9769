"""The ```python blocks of a docs page, for the tests that execute them."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(page: str) -> list[str]:
    """Every ```python block of ``docs/<page>``, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def run_blocks(page: str) -> dict[str, object]:
    """Execute the page's python blocks one after the other in one namespace, as a reader would."""
    namespace: dict[str, object] = {"__name__": f"docs.{page}"}
    for i, block in enumerate(python_blocks(page)):
        exec(compile(block, f"docs/{page} block {i + 1}", "exec"), namespace)
    return namespace

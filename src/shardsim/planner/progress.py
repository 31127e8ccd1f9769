"""Progress of a search on stderr: one line rewritten in place, only when stderr is a terminal.

A plain counter (no dependency: ``tqdm`` and ``rich`` are not part of the core).

>>> p = Progress(total=3, enabled=False)
>>> p.update(considered=3, traced=1, kept=1); p.close()
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``planning: 1200/16000 candidates, 14 layer programs traced, 90 plans kept, 2.1 s``."""

    def __init__(self, total: int, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.start, self.last = total, time.perf_counter(), 0.0

    def update(self, *, considered: int, traced: int, kept: int, force: bool = False) -> None:
        """Rewrite the line (at most ten times a second)."""
        now = time.perf_counter()
        if not self.enabled or (now - self.last < 0.1 and not force):
            return
        self.last = now
        self.stream.write(
            f"\rplanning: {considered}/{self.total} candidates, {traced} layer programs traced, "
            f"{kept} plans kept, {now - self.start:.1f} s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

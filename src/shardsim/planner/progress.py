"""Progress of a long computation on stderr: one line rewritten in place.

``enabled=None`` (the default of :func:`shardsim.planner.plan` and of the calibration
table, from the Python API as from the command line): the line appears once the work has
run for a second, and only when stderr is a terminal, so a quick answer, a pipe or a test's
captured output never sees it. ``True`` writes it from the start, ``False`` never. A plain
counter, no dependency (``tqdm`` and ``rich`` are not part of the core).

>>> import io
>>> out = io.StringIO()
>>> p = Progress(total=3, enabled=True, stream=out)
>>> p.update(considered=3, traced=1, kept=1, force=True); p.close()
>>> out.getvalue().split(", ")[0]
'\\rplanning: 3/3 candidates'
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Seconds a computation runs before its automatic progress line appears.
DELAY = 1.0


class Progress:
    """``planning: 1200/16000 candidates, 14 layer programs traced, 90 plans kept, 2.1 s``;
    :meth:`show` writes any other line under the same rules."""

    def __init__(self, total: int, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self.delay = DELAY if enabled is None else 0.0
        self.total, self.start, self.last, self.shown = total, time.perf_counter(), 0.0, False

    def update(self, *, considered: int, traced: int, kept: int, force: bool = False) -> None:
        """The planner's line (at most ten times a second)."""
        self.show(
            f"planning: {considered}/{self.total} candidates, {traced} layer programs traced, {kept} plans kept",
            force=force,
        )

    def show(self, text: str, *, force: bool = False) -> None:
        """Rewrite the line with ``text`` and the seconds so far: at most ten times a second, and
        in automatic mode only after :data:`DELAY` seconds (``force``: now, if it is showing)."""
        now = time.perf_counter()
        if not self.enabled or (now - self.start < self.delay and not (force and self.shown)):
            return
        if now - self.last < 0.1 and not force:
            return
        self.last, self.shown = now, True
        self.stream.write(f"\r{text}, {now - self.start:.1f} s")
        self.stream.flush()

    def close(self) -> None:
        """End the line, if one was written."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if isatty is not None else False


__all__ = ["DELAY", "Progress"]

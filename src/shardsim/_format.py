"""Numbers, units and tables, rendered once for text, the terminal and notebooks.

Every table the library prints (traces, memory ledgers, cost estimates and time lines) goes
through these few functions, so a figure reads the same in ``print``, in the CLI and in a
notebook's HTML: bytes in binary units (KiB, MiB, GiB), FLOPs and rates with SI prefixes,
times in s / ms / µs, numbers right-aligned. This is a small module of our own rather than a
dependency such as ``rich``: the output must be identical byte for byte in text and HTML
(tests compare the two), plain enough for doctests, and the core stays NumPy-only.

>>> print(table_text([("op", "sent"), ("all_gather", fmt_bytes(1536)), ("matmul", "-")], right={1}))
op               sent
all_gather  1.5 KiB
matmul            -
"""

from __future__ import annotations

import html
from collections.abc import Callable, Collection, Sequence


class Deferred:
    """Text built only when printed, such as how an op's errors name it (``x[B, D] (4, 8) + 2.0``):
    every elementwise op would otherwise print its operands for an error it almost never raises.

    >>> f"{Deferred(lambda: 'a' + 'b')}"
    'ab'
    """

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], str]) -> None:
        self._make = make

    def __str__(self) -> str:
        return self._make()


_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_bytes(n: float) -> str:
    """``1.5 KiB``: bytes in binary units, whole bytes below 1 KiB.

    >>> fmt_bytes(1023), fmt_bytes(1536), fmt_bytes(3 * 2**30)
    ('1023 B', '1.5 KiB', '3.0 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def fmt_si(value: float, unit: str) -> str:
    """``value`` with an SI prefix and three significant digits: FLOPs, FLOP/s, B/s.

    >>> fmt_si(1.979e15, "FLOP/s"), fmt_si(4.5e10, "B/s"), fmt_si(512, "FLOP")
    ('1.98 PFLOP/s', '45 GB/s', '512 FLOP')
    """
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def fmt_time(seconds: float) -> str:
    """Seconds in s, ms or µs, four significant digits.

    >>> fmt_time(2.5), fmt_time(0.0123456), fmt_time(7.5e-7), fmt_time(0)
    ('2.5 s', '12.35 ms', '0.75 µs', '0 s')
    """
    if seconds == 0 or abs(seconds) >= 1:
        return f"{seconds:.4g} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} µs"


def table_text(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> str:
    """``rows`` (the first is the header) as fixed-width text; columns in ``right`` (the
    numbers) are right-aligned, the others left-aligned; two spaces between columns.

    >>> print(table_text([("chip", "peak"), ("(X0)", "128 B"), ("(X1)", "1.0 KiB")], right={1}))
    chip     peak
    (X0)    128 B
    (X1)  1.0 KiB
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    )


def table_html(rows: Sequence[Sequence[str]], right: Collection[int] = (), caption: str = "") -> str:
    """The same table as HTML: a ``<th>`` header row, the cells of the columns in ``right``
    in ``<td style="text-align:right">``, every label escaped; the cells' text is
    :func:`table_text`'s.

    >>> print(table_html([("op", "sent"), ("a<b", "1 B")], right={1}).replace("<tr>", "\\n<tr>"))
    <table><thead>
    <tr><th style="text-align:left">op</th><th style="text-align:right">sent</th></tr></thead><tbody>
    <tr><td style="text-align:left">a&lt;b</td><td style="text-align:right">1 B</td></tr></tbody></table>
    """

    def cells(row: Sequence[str], tag: str) -> str:
        return "".join(
            f'<{tag} style="text-align:{"right" if i in right else "left"}">{html.escape(c)}</{tag}>'
            for i, c in enumerate(row)
        )

    # left-aligned: a centred caption wraps into a narrow column over a narrow table
    head = f'<caption style="text-align:left">{html.escape(caption)}</caption>' if caption else ""
    body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows[1:])
    return f"<table>{head}<thead><tr>{cells(rows[0], 'th')}</tr></thead><tbody>{body}</tbody></table>"

"""``shardsim schemes``: the registered schemes, their roles, what each does and the options it reads.

>>> from shardsim.cli import main
>>> main(["schemes"])  # doctest: +ELLIPSIS
scheme  ...
ddp     data ...
0
"""

from __future__ import annotations

import argparse
import textwrap

from .. import strategies
from .._format import table_text
from .framework import subcommand
from .output import WIDTH


@subcommand("schemes", "list the registered schemes, their roles, what each does and the options it reads")
def schemes(args: argparse.Namespace) -> int:
    """``shardsim schemes``: one line per registered scheme."""
    names = strategies.names()
    lead = max(len(n) for n in names) + max(len(",".join(strategies.get(n).roles)) for n in names) + 4
    rows: list[tuple[str, ...]] = [("scheme", "roles", "what it does")]
    for name in names:
        s = strategies.get(name)
        text = s.summary + (f" (--option {', '.join(s.options)})" if s.options else "")
        lines = textwrap.wrap(text, max(30, WIDTH - lead))
        rows.append((name, ",".join(s.roles), lines[0]))
        rows.extend(("", "", more) for more in lines[1:])
    print(table_text(rows))
    return 0

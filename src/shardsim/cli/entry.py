"""``shardsim``'s entry point: every command registered, in the order ``shardsim --help`` lists them.

>>> main(["demo", "--scheme", "ddp", "--quiet"])
ddp on Mesh(X=2): PASS
0
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .framework import run_command

# Importing a command's module registers it: this order is the order ``shardsim --help`` lists them.
# isort: off
from . import demo, schemes, train, estimate, plan  # noqa: F401
# isort: on


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Never raises: every error is one line on stderr and exit code 2; Ctrl-C exits 130.

    >>> main(["--version"])  # doctest: +ELLIPSIS
    shardsim ...
    0
    """
    try:
        return run_command(argv)
    except KeyboardInterrupt:
        print("shardsim: interrupted", file=sys.stderr)
        return 130

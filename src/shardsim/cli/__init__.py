"""The ``shardsim`` command line: ``shardsim demo`` runs the seed's toy MLP through the schemes.

One module per idea: :mod:`~shardsim.cli.framework` (the registry of subcommands, the parser
and the one-line errors), :mod:`~shardsim.cli.args` (argument types and limits),
:mod:`~shardsim.cli.output` (JSON, CSV, progress and output files), one module per command
or family of commands (:mod:`~shardsim.cli.demo` with :mod:`~shardsim.cli.demo_text`,
:mod:`~shardsim.cli.schemes`, :mod:`~shardsim.cli.train`, :mod:`~shardsim.cli.estimate` for
``estimate``, ``sweep`` and ``critical``, :mod:`~shardsim.cli.plan`), and
:mod:`~shardsim.cli.entry`, which registers them in order. What the commands run is library
code below them: a demo is :mod:`shardsim.cli.demo_run`.

Each subcommand is one function registered with :func:`subcommand`; its ``configure``
function adds its options to its own parser. A new subcommand is one more decorated
function, nothing else::

    def _chips_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--mesh", type=mesh_type(), default={"X": 2, "Y": 4})

    @subcommand("chips", "list the chips of a mesh", configure=_chips_options)
    def chips(args: argparse.Namespace) -> int:
        ...
        return 0

A subcommand returns the exit code: 0 when all is well, 1 when a check failed. Every error
is one line on stderr and exit code 2, never a traceback: a bad option (argparse's message,
with the flag), a :class:`~shardsim.ShardsimError` (a mesh that does not fit, sizes that do
not divide, an unknown scheme, a run too big for the host), a file that cannot be written.
Ctrl-C prints one line and exits 130.

>>> main(["demo", "--scheme", "ddp", "--quiet"])
ddp on Mesh(X=2): PASS
0
"""

from __future__ import annotations

from .args import LIMITS, count, key_values, mesh_sizes, mesh_type, positive_int, seed
from .demo_run import DemoRun, demo_mesh, grad_name, run_demo
from .demo_text import step_rows
from .entry import main
from .framework import COMMANDS, Subcommand, UsageError, build_parser, commands, subcommand

__all__ = [
    "COMMANDS",
    "LIMITS",
    "DemoRun",
    "Subcommand",
    "UsageError",
    "build_parser",
    "commands",
    "count",
    "demo_mesh",
    "grad_name",
    "key_values",
    "main",
    "mesh_sizes",
    "mesh_type",
    "positive_int",
    "run_demo",
    "seed",
    "step_rows",
    "subcommand",
]

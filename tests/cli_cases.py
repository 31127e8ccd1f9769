"""Hostile command lines for ``shardsim``: a cheap valid invocation of every subcommand, and
mutations that each make it invalid (a value of the wrong kind, out of range, an unknown
flag or command...).

Shared by ``tests/test_cli_hostile.py`` (a bounded property test) and
``benchmarks/campaign_cli.py`` (a long campaign by hand), so both speak of the same classes.
Every mutated command line must exit 2 with one line on stderr; every base must exit 0.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
from pathlib import Path

#: Cheap invocations that succeed (exit 0), per subcommand.
BASES: dict[str, list[list[str]]] = {
    "demo": [
        ["demo", "--quiet", "--scheme", "ddp"],
        ["demo", "--quiet", "--scheme", "fsdp_tp"],
        ["demo", "--scheme", "tp"],
        ["demo", "--quiet", "--scheme", "pp", "--option", "microbatches=2"],
    ],
    "train": [["train", "--quiet", "--steps", "2", "--scheme", "ddp"]],
    "estimate": [["estimate", "--mesh", "X=16"], ["estimate", "--scheme", "ddp", "--chips", "8", "--hardware", "h100"]],
    "sweep": [["sweep", "--chips", "8", "--hardware", "h100", "--batches", "1024,4096"]],
    "critical": [["critical"], ["critical", "--scheme", "ddp", "--chips", "16"]],
    "schemes": [["schemes"]],
    "plan": [["plan", "--model", "gpt-tiny", "--chips", "2", "--batch-tokens", "64", "--seq", "16", "--allow", "dp"]],
}
BASES["demo"] += [["demo", "--model", "gpt-tiny", "--quiet", "--plan", "tp=2"]]
BASES["critical"] += [["critical", "--scheme", "pp"]]

_COUNT = ["0", "-1", "-16", "1.5", "1e9", "", " ", "abc", "²", "nan", "inf", "0x10", "9" * 30, "1" + "0" * 400]
_COUNT += ["+2", "1_6", "١٦"]
_MESH = ["X=²", "X=0", "X=-2", "X", "=2", "X=2,X=2", "X=1000000000", "X=2,,Y=2", "X=1.5", "", "X=2=3", "X=inf"]
_MESH += ["X=+2", "X=2_0", "X=٢", "X=0x2"]


def hostile_paths() -> list[str]:
    """A link to a file, a dangling link and a FIFO in a fresh folder (removed at exit): paths an
    output file must never be written through, nor block on."""
    folder = Path(tempfile.mkdtemp(prefix="shardsim-cli-cases-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "victim").write_text("")
    (folder / "link").symlink_to(folder / "victim")
    (folder / "dangling").symlink_to(folder / "nowhere")
    paths = [str(folder / "link"), str(folder / "dangling")]
    if hasattr(os, "mkfifo"):
        os.mkfifo(folder / "fifo")
        paths.append(str(folder / "fifo"))
    return paths


#: Paths no output file may be written to.
_OUT = ["", "/nonexistent-shardsim-dir/x.out", "/", "/dev/null", *hostile_paths()]
#: Hostile values for each flag, by what the flag takes.
VALUES: dict[str, list[str]] = {
    "--batch": _COUNT,
    "--d-model": _COUNT,
    "--d-ff": _COUNT,
    "--chips": [*_COUNT, "1000000000"],
    "--steps": [*_COUNT, "100000"],
    "--layers": [*_COUNT, "100000"],
    "--width": [*_COUNT, "5", "100000"],
    "--per-chip-batch": _COUNT,
    "--mesh": _MESH,
    "--seed": ["-1", "4294967296", "x", "1.0", "", "-0x1"],
    "--lr": ["nan", "inf", "-1", "0", "x", "", "-inf", "1e999"],
    "--batches": ["1:2", "a,b", "0,1", "100:1:5", "1:100:1", "1:100:100000", "nan:1:3", "-5,10", ",,", "1:inf:3"],
    "--png": _OUT,
    "--chrome-trace": _OUT,
    "--seq": _COUNT,
    "--reduce-dtype": ["int8", "bool", "complex64", "int64", "", "nosuch"],
    "--allow": ["", ",", "nosuch", "dp,,nosuch"],
    "--scheme": ["nosuch", "", "ALL", "ddp,,nosuch"],
    "--schemes": ["nosuch", "", ",", "ddp,nosuch"],
    "--hardware": ["nosuch", ""],
    "--dtype": ["int8", ""],
    "--option": ["microbatchs=2", "=", "microbatches=0", "microbatches=99999", "x", "top_k=2"],
    "--optimizer": ["lion", ""],
    "--precision": ["fp8"],
    "--activation": ["tanh", ""],
    "--axes": ["data", "pipe=P", "=X", "data=X,data=Y"],
    "--links": ["X", "X=nosuch", "Q=dcn"],
}
#: The flags each subcommand takes (a mutation only sets a flag the command has).
FLAGS: dict[str, list[str]] = {
    "demo": ["--batch", "--d-model", "--d-ff", "--mesh", "--seed", "--scheme", "--dtype", "--option", "--activation"],
    "train": ["--batch", "--d-model", "--d-ff", "--chips", "--steps", "--layers", "--seed", "--lr", "--scheme"],
    "estimate": ["--d-model", "--d-ff", "--layers", "--chips", "--mesh", "--width", "--png", "--per-chip-batch"],
    "sweep": ["--d-model", "--d-ff", "--layers", "--chips", "--batches", "--schemes", "--hardware", "--png"],
    "critical": ["--d-model", "--d-ff", "--layers", "--chips", "--mesh", "--hardware", "--scheme", "--links"],
    "schemes": [],
}
FLAGS["train"] += ["--optimizer", "--precision", "--reduce-dtype", "--chrome-trace"]
FLAGS["estimate"] += ["--scheme", "--hardware", "--links", "--chrome-trace"]
FLAGS["demo"] += ["--chrome-trace"]
FLAGS["plan"] = ["--chips", "--allow", "--seq"]
VALUES["--batches"] += ["1:10:nan", "1:10:inf"]

#: The mutation classes (what a campaign counts by).
CLASSES = ("bad value", "unknown flag", "missing value", "unknown command", "bad value twice")


def mutate(argv: list[str], kind: str, rng: random.Random) -> list[str]:
    """``argv`` made invalid in the way ``kind`` names."""
    command = argv[0]
    flags = FLAGS[command]
    if kind == "unknown command":
        return [rng.choice(["nosuch", "dem", "DEMO", "", "--demo", "-x"]), *argv[1:]]
    if kind == "unknown flag" or not flags:
        return [*argv, rng.choice(["--nosuch", "--batchs", "-q", "--json=1", "--", "extra"])]
    flag = rng.choice(flags)
    if kind == "missing value":
        return [*argv, flag]
    out = [*argv, flag, rng.choice(VALUES[flag])]
    if kind == "bad value twice":
        other = rng.choice(flags)
        out += [other, rng.choice(VALUES[other])]
    return out


def random_case(rng: random.Random) -> tuple[str, list[str]]:
    """``(class, argv)``: a mutated command line of a random class, or ``("valid", base)``."""
    command = rng.choice(list(BASES))
    base = list(rng.choice(BASES[command]))
    if rng.random() < 0.05:
        return "valid", base
    kind = rng.choice(CLASSES)
    return kind, mutate(base, kind, rng)

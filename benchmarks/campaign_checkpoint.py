"""A campaign of hostile checkpoint inputs, counted per class of input and class of failure.

Run by hand (not by pytest):  PYTHONPATH=src python benchmarks/campaign_checkpoint.py [--scale 1.0] [--seed 1]

Every input starts from a fresh copy of a small valid checkpoint (two sharded arrays, a
replicated one, a partial sum and plain values on ``Mesh(X=2, Y=2)``) beside a directory of
"outside" files an attacker would like read: a valid block of the right shape, a FIFO and a
large file. Then one thing is made hostile and ``load`` (or ``save``) runs, in a thread with
a time limit. The input classes:

- truncations of any file at any length; with the index re-signed to the new size, too;
- bit flips anywhere in any file;
- substitutions: a file replaced by another file of the checkpoint, or by the same file of
  another checkpoint of the same values;
- links: symbolic links to the outside block (with a re-signed index), to the outside FIFO,
  to ``/dev/zero``, to another file inside; hard links to the outside block;
- special files: FIFOs, sockets, character devices, directories in a file's place;
- forged ``.npy`` headers: another shape, dtype, byte order, Fortran order, a huge shape, an
  object dtype, garbage, re-signed in the index;
- forged indexes: deeply nested or oversized text, and random edits of the parsed index,
  re-signed (a hostile writer);
- foreign directories: ``save`` into a directory that holds the user's files;
- interrupted saves: an exception at the n-th write, fsync or rename, and SIGKILL of a
  process that keeps saving, after a random delay.

The failure classes counted, each expected to be 0:

- reads outside: the outside block's data comes back, or its name, size or checksum prefix
  appears in a message, or an outside file is opened (an audit hook sees every ``open``);
- data lost: after an interrupted save the checkpoint at the path is neither the old one nor
  the new one, bit for bit; or a save deleted a file it did not write;
- wrong results: ``load`` returned values that differ from the saved ones (not counted for
  re-signed index edits, which are a valid checkpoint of other data by construction);
- undocumented exceptions: anything but a ``ShardsimError``;
- hangs: a call still running after 10 s.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _timing import cpu

import shardsim
from shardsim import checkpoint

FAILURES = ("reads outside", "data lost", "wrong results", "undocumented exceptions", "hangs")
TIMEOUT = 10.0
MESH = shardsim.Mesh(X=2, Y=2)


def the_state(mesh: shardsim.Mesh, k: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(k)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    partial = shardsim.from_local(rng.standard_normal((2, 2, 4, 3)), mesh, "[A_X, B]{U_Y}")
    return {
        "mlp": {"w": shardsim.shard(w, mesh, "A_X B_Y"), "p": partial},
        "bias": shardsim.shard(w[0].astype(np.float16), mesh, "B"),
        "step": 3 + k,
        "meta": {"lr": 0.5, "tags": ["a", None, True]},
    }


def same_state(got: Any, want: dict[str, Any]) -> bool:
    if not isinstance(got, dict):
        return False
    try:
        return (
            got["step"] == want["step"]
            and got["meta"] == want["meta"]
            and all(
                a.tobytes() == b.tobytes() and a.dtype == b.dtype
                for a, b in [
                    (got["mlp"]["w"].to_global(), want["mlp"]["w"].to_global()),
                    (np.asarray(got["mlp"]["p"].blocks()), np.asarray(want["mlp"]["p"].blocks())),
                    (got["bias"].to_global(), want["bias"].to_global()),
                ]
            )
        )
    except Exception:  # a malformed result is a wrong result
        return False


class Watch:
    """Runs a call in a thread with a time limit; sees every file it opens (an audit hook)."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.active = False
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            self.opened.append(os.fsdecode(args[0]))

    def run(self, fn: Callable[[], Any]) -> tuple[str, Any]:
        box: list[tuple[str, Any]] = []

        def target() -> None:
            try:
                box.append(("ok", fn()))
            except shardsim.ShardsimError as e:
                box.append(("error", e))
            except BaseException as e:  # counted as undocumented
                box.append(("undocumented", e))

        self.opened.clear()
        self.active = True
        t = threading.Thread(target=target, daemon=True)
        t.start()
        t.join(TIMEOUT)
        self.active = False
        if t.is_alive():
            return "hang", None
        return box[0]


class Campaign:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.watch = Watch()
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.inputs: collections.Counter[str] = collections.Counter()
        self.examples: dict[tuple[str, str], str] = {}
        self.state = the_state(MESH)
        self.other = the_state(MESH, 1)
        self.template = checkpoint.save(root / "template", self.state)
        self.other_template = checkpoint.save(root / "other", self.other)
        self.outside = root / "elsewhere_zq"
        self.outside.mkdir()
        self.secret = self.outside / "hidden_zq.npy"
        np.save(self.secret, np.full((4, 4), 7.0, np.float32))  # the shape of a block of w
        self.secret_bytes = self.secret.read_bytes()
        os.mkfifo(self.outside / "pipe_zq")
        with open(self.outside / "large_zq.bin", "wb") as f:
            f.truncate(3 * 2**30)  # sparse: 3 GiB that take no disk
        self.files = sorted(p.name for p in self.template.iterdir())
        self.n = 0

    # -- bookkeeping --------------------------------------------------------------------
    def fresh(self) -> Path:
        self.n += 1
        path = self.root / f"case{self.n}"
        shutil.copytree(self.template, path)
        return path

    def done(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def fail(self, cls: str, what: str, detail: str) -> None:
        self.counts[cls][what] += 1
        self.examples.setdefault((cls, what), detail)

    def judge_load(self, cls: str, path: Path, exact: bool = True) -> None:
        """Load ``path`` and count what went wrong."""
        self.inputs[cls] += 1
        outcome, value = self.watch.run(lambda: checkpoint.load(path, MESH))
        # Opens under the campaign's directory but outside this checkpoint (imports and the like
        # open files elsewhere; those are not the checkpoint's doing).
        inside = (str(path), f"{path}/")
        opened = [p for p in self.watch.opened if p.startswith(str(self.root)) and not p.startswith(inside)]
        if opened or (outcome == "ok" and self._has_secret(value)):
            self.fail(cls, "reads outside", f"{opened or value}")
        if outcome == "hang":
            self.fail(cls, "hangs", str(path))
        elif outcome == "undocumented":
            self.fail(cls, "undocumented exceptions", repr(value))
        elif outcome == "error":
            if self._leaks(str(value)):
                self.fail(cls, "reads outside", str(value))
        elif exact and not same_state(value, self.state):
            self.fail(cls, "wrong results", str(path))

    def _has_secret(self, value: Any) -> bool:
        try:
            return bool((value["mlp"]["w"].to_global() == 7.0).any())
        except Exception:  # a result without that value cannot hold it
            return False

    def _leaks(self, message: str) -> bool:
        digest = hashlib.sha256(self.secret_bytes).hexdigest()
        return "_zq" in message or digest[:8] in message or str(3 * 2**30) in message

    def sign_as(self, path: Path, file: str, data: bytes) -> None:
        index = json.loads((path / "index.json").read_text())
        for meta in index["arrays"].values():
            for b in meta["blocks"]:
                if b["file"] == file:
                    b.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        self.resign(path, index)

    def resign(self, path: Path, index: Any) -> None:
        if isinstance(index, dict):
            index["sha256"] = checkpoint._index_digest(index)
        (path / "index.json").write_text(json.dumps(index))

    def block_files(self) -> list[str]:
        return [f for f in self.files if f != "index.json"]

    # -- input classes ------------------------------------------------------------------
    def truncation(self) -> None:
        path = self.fresh()
        name = self.rng.choice(self.files)
        data = (path / name).read_bytes()
        cut = data[: self.rng.randrange(len(data))]
        (path / name).write_bytes(cut)
        if name != "index.json" and self.rng.random() < 0.5:
            self.sign_as(path, name, cut)
        self.judge_load("truncations", path)
        self.done(path)

    def bit_flip(self) -> None:
        path = self.fresh()
        name = self.rng.choice(self.files)
        data = bytearray((path / name).read_bytes())
        for _ in range(self.rng.choice([1, 1, 1, 2, 8])):
            k = self.rng.randrange(len(data))
            data[k] ^= 1 << self.rng.randrange(8)
        (path / name).write_bytes(bytes(data))
        self.judge_load("bit flips", path)
        self.done(path)

    def substitution(self) -> None:
        path = self.fresh()
        name = self.rng.choice(self.files)
        if self.rng.random() < 0.5:
            source = path / self.rng.choice([f for f in self.files if f != name])
        else:
            source = self.other_template / name
        (path / name).write_bytes(source.read_bytes())
        self.judge_load("substitutions", path)
        self.done(path)

    def link(self) -> None:
        path = self.fresh()
        name = self.rng.choice(self.block_files() + ["index.json"])
        (path / name).unlink()
        how = self.rng.choice(["out", "out-signed", "fifo", "zero", "large", "inside", "hard", "hard-signed"])
        if how.startswith("out"):
            (path / name).symlink_to(self.secret)
        elif how == "fifo":
            (path / name).symlink_to(self.outside / "pipe_zq")
        elif how == "zero":
            (path / name).symlink_to("/dev/zero")
        elif how == "large":
            (path / name).symlink_to(self.outside / "large_zq.bin")
        elif how == "inside":
            (path / name).symlink_to(self.rng.choice([f for f in self.files if f != name]))
        else:
            os.link(self.secret, path / name)
        if how.endswith("signed") and name != "index.json":
            self.sign_as(path, name, self.secret_bytes)
        self.judge_load("links", path)
        self.done(path)

    def special(self) -> None:
        path = self.fresh()
        name = self.rng.choice(self.files)
        (path / name).unlink()
        how = self.rng.choice(["fifo", "socket", "device", "directory"])
        if how == "fifo":
            os.mkfifo(path / name)
        elif how == "socket":
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(path / name))
            s.close()
        elif how == "device":
            try:
                os.mknod(path / name, stat.S_IFCHR | 0o600, os.makedev(1, 5))
            except PermissionError:
                os.mkfifo(path / name)
        else:
            (path / name).mkdir()
        self.judge_load("FIFOs and special files", path)
        self.done(path)

    def forged_header(self) -> None:
        path = self.fresh()
        name = self.rng.choice([f for f in self.block_files() if f.startswith("mlp.w")])
        data = (path / name).read_bytes()
        body = data[128:]
        shape = self.rng.choice([(4, 4), (16,), (2, 8), (4, 4, 1), (10**6, 10**6), (2**62,), (), (0,), (-1, 4)])
        descr = self.rng.choice(["<f4", ">f4", "<i4", "<f8", "|u1", "|O", "<c8", "V4", "<U1", "garbage"])
        fortran = self.rng.random() < 0.2
        if self.rng.random() < 0.1:
            header = "{" + "".join(self.rng.choice("{}[]()'\":,0123456789abc ") for _ in range(60))
        else:
            header = repr({"descr": descr, "fortran_order": fortran, "shape": shape})
        raw = header.encode("latin1")
        raw += b" " * ((-len(raw) - 11) % 64) + b"\n"
        forged = b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + body
        (path / name).write_bytes(forged)
        self.sign_as(path, name, forged)
        exact = (descr, shape, fortran) == ("<f4", (4, 4), False)
        self.judge_load("forged headers", path, exact=exact)
        self.done(path)

    def forged_index(self) -> None:
        path = self.fresh()
        roll = self.rng.random()
        if roll < 0.2:
            depth = self.rng.choice([65, 100, 1000, 100_000])
            opener = self.rng.choice(["[", '{"a":'])
            closer = "]" if opener == "[" else "}"
            (path / "index.json").write_text(opener * depth + "1" + closer * depth)
            exact = True
        elif roll < 0.25:
            with open(path / "index.json", "ab") as f:
                f.truncate(checkpoint.MAX_INDEX_BYTES + self.rng.randrange(1, 2**20))
            exact = True
        else:
            index = json.loads((path / "index.json").read_text())
            for _ in range(self.rng.randrange(1, 4)):
                self._edit(index)
            self.resign(path, index)
            exact = False  # a re-signed edit is a valid checkpoint of other values: count crashes only
        self.judge_load("forged indexes", path, exact=exact)
        self.done(path)

    def _edit(self, index: Any) -> None:
        paths: list[tuple[Any, Any]] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for k in list(node):
                    paths.append((node, k))
                    walk(node[k])
            elif isinstance(node, list):
                for i in range(len(node)):
                    paths.append((node, i))
                    walk(node[i])

        walk(index)
        if not paths:
            return
        node, key = self.rng.choice(paths)
        choice = self.rng.random()
        if choice < 0.2 and isinstance(node, dict):
            del node[key]
            return
        values: list[Any] = [
            None,
            True,
            -1,
            0,
            1,
            2**63,
            10**400,
            1.5,
            float("inf"),
            "",
            "*",
            "X",
            "../x.npy",
            "a\0b",
            "αβ",
            [],
            {},
            [1, [2, [3]]],
            {"dict": {}},
            {"array": "mlp/w"},
            "float32",
            "object",
            "V4",
            [10**6, 10**6],
        ]
        value = self.rng.choice(values)
        if value == float("inf"):
            value = 1e308
        node[key] = value

    def foreign_directory(self) -> None:
        """``save`` into a directory holding the user's files: refused, and the files untouched."""
        self.inputs["foreign directories"] += 1
        self.n += 1
        path = self.root / f"case{self.n}"
        how = self.rng.choice(["plain", "index", "checkpoint+file", "checkpoint+dir", "stray-with-file"])
        if how == "plain":
            path.mkdir()
            (path / "notes.txt").write_text("mine")
        elif how == "index":
            path.mkdir()
            (path / "index.json").write_text(self.rng.choice(['{"a": 1}', "[]", "{", '{"format": "x"}']))
            (path / "notes.txt").write_text("mine")
        elif how == "stray-with-file":
            shutil.copytree(self.template, path)
            stray = self.root / f".case{self.n}.tmp-{self.rng.getrandbits(48):012x}"
            stray.mkdir()
            (stray / "notes.txt").write_text("mine")
        else:
            shutil.copytree(self.template, path)
            if how == "checkpoint+file":
                (path / self.rng.choice(["notes.txt", "x.npy", ".hidden"])).write_text("mine")
            else:
                (path / "results").mkdir()
                (path / "results" / "notes.txt").write_text("mine")
        before = {
            p: p.read_bytes()
            for p in list(path.rglob("*")) + list(self.root.glob(f".case{self.n}.*/*"))
            if p.is_file() and (p.suffix == ".txt" or p.name in ("x.npy", ".hidden"))
        }
        outcome, value = self.watch.run(lambda: checkpoint.save(path, self.other))
        if outcome == "hang":
            self.fail("foreign directories", "hangs", str(path))
        elif outcome == "undocumented":
            self.fail("foreign directories", "undocumented exceptions", repr(value))
        for p, data in before.items():
            if not p.exists() or p.read_bytes() != data:
                self.fail("foreign directories", "data lost", f"{how}: {p}")
        for stray in self.root.glob(f".case{self.n}.*"):
            shutil.rmtree(stray, ignore_errors=True)
        self.done(path)

    def interrupted_save(self) -> None:
        """An exception at the n-th write, fsync or rename of a save: the old or the new checkpoint."""
        self.inputs["interrupted saves"] += 1
        path = self.fresh()
        calls = {"n": 0}
        stop_at = self.rng.randrange(1, 40)
        error = self.rng.choice([KeyboardInterrupt, OSError])
        real = {name: getattr(os, name) for name in ("write", "fsync", "rename", "replace", "mkdir", "unlink")}

        def counted(name: str) -> Callable[..., Any]:
            def call(*args: Any, **kw: Any) -> Any:
                calls["n"] += 1
                if calls["n"] == stop_at:
                    raise error(28, "No space left on device") if error is OSError else error()
                return real[name](*args, **kw)

            return call

        for name in real:
            setattr(os, name, counted(name))
        try:
            outcome, value = self.watch.run(lambda: checkpoint.save(path, self.other))
        finally:
            for name, fn in real.items():
                setattr(os, name, fn)
        if outcome == "hang":
            self.fail("interrupted saves", "hangs", str(path))
        elif outcome == "undocumented" and not isinstance(value, KeyboardInterrupt):
            self.fail("interrupted saves", "undocumented exceptions", repr(value))
        self._check_whole(path, "interrupted saves")

    def killed_save(self, delay: float) -> None:
        """SIGKILL a process that keeps saving, after ``delay`` seconds."""
        self.inputs["interrupted saves"] += 1
        path = self.fresh()
        code = (
            "import sys; sys.path.insert(0, sys.argv[2]); from campaign_checkpoint import the_state, MESH; "
            "from shardsim import checkpoint; s = [the_state(MESH, 1), the_state(MESH)]; print('ready', flush=True)\n"
            "k = 0\nwhile True:\n    checkpoint.save(sys.argv[1], s[k % 2]); k += 1"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(Path(__file__).resolve().parent)], stdout=subprocess.PIPE
        )
        assert child.stdout is not None
        child.stdout.readline()
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        self._check_whole(path, "interrupted saves")

    def _check_whole(self, path: Path, cls: str) -> None:
        outcome, value = self.watch.run(lambda: checkpoint.load(path, MESH))
        if outcome != "ok" or not (same_state(value, self.state) or same_state(value, self.other)):
            self.fail(cls, "data lost", f"{path}: {outcome} {value}")
        again, value = self.watch.run(lambda: checkpoint.save(path, self.state))  # sweeps the strays
        left = [p.name for p in self.root.glob(f".{path.name}.*")]
        if again != "ok" or left:
            self.fail(cls, "data lost", f"{path}: the next save: {again} {value}, strays {left}")
        self.done(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every class's count")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    plan = {
        "truncation": 5000,
        "bit_flip": 5000,
        "substitution": 3000,
        "link": 4000,
        "special": 2000,
        "forged_header": 4000,
        "forged_index": 5000,
        "foreign_directory": 1000,
        "interrupted_save": 1500,
    }
    kills = 100
    print(
        f"# {cpu()}; Python {platform.python_version()}, NumPy {np.__version__}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; seed {args.seed}, scale {args.scale}"
    )
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        c = Campaign(Path(tmp), args.seed)
        order = [name for name, n in plan.items() for _ in range(math.ceil(n * args.scale))]
        c.rng.shuffle(order)
        for k, name in enumerate(order):
            getattr(c, name)()
            if k % 5000 == 4999:
                print(f"  {k + 1} inputs, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        for _ in range(math.ceil(kills * args.scale)):
            c.killed_save(c.rng.uniform(0.0, 0.3))
        os.unlink(c.outside / "pipe_zq")
    elapsed = time.monotonic() - start
    total = sum(c.inputs.values())
    print(f"\n{total} hostile inputs in {elapsed:.0f} s\n")
    print("| input class | inputs | " + " | ".join(FAILURES) + " |")
    print("|---|---:|" + "---:|" * len(FAILURES))
    for cls, n in c.inputs.items():
        print(f"| {cls} | {n} | " + " | ".join(str(c.counts[cls][f]) for f in FAILURES) + " |")
    print(f"| **all** | {total} | " + " | ".join(str(sum(c.counts[k][f] for k in c.counts)) for f in FAILURES) + " |")
    for (cls, what), detail in sorted(c.examples.items()):
        print(f"\nfirst {what} in {cls}: {detail[:500]}")


if __name__ == "__main__":
    main()

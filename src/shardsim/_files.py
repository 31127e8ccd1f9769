"""File-system access for checkpoints: nothing outside the directory, nothing unbounded.

Every file of a checkpoint is opened relative to the checkpoint directory's own descriptor
(``dir_fd``), after ``lstat`` says it is a regular file with one link, and with
``O_NOFOLLOW | O_NONBLOCK``, so a symbolic link, a FIFO, a device or a directory put in a
block's place is refused before a byte of it is read, and ``load`` cannot hang on a pipe. A
hard-linked file is refused too: it may be a file that lives elsewhere.

Writes go to a fresh directory; an existing checkpoint is swapped out in one atomic rename
(``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames), and only files a checkpoint
writes are ever deleted.

>>> import tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> (d / "a.npy").write_bytes(b"12345")
5
>>> with Folder(d) as folder:
...     folder.regular("a.npy", "block").st_size
5
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import CheckpointError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

INDEX = "index.json"
# The names ``save`` gives block files; ``load`` opens nothing else (no path separators, no
# leading dot, no NUL, bounded length).
BLOCK_NAME = re.compile(r"[A-Za-z0-9_~-][A-Za-z0-9_.~-]{0,199}\.npy")
# POSIX flags (getattr: the module still imports where one is missing).
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ = os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_DIR = DIRECTORY | getattr(os, "O_NONBLOCK", 0)


def cause(e: BaseException) -> str:
    """The reason an OS call failed, in words (``[Errno 28] No space left on device``)."""
    if isinstance(e, ValueError) and "null" in str(e):
        return "the path contains a NUL byte"
    if isinstance(e, OSError) and e.errno is not None:
        return f"[Errno {e.errno}] {e.strerror}"
    return str(e) or type(e).__name__


def kind(mode: int) -> str:
    """What a directory entry is, for a message: 'a symbolic link', 'a named pipe (FIFO)'..."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class MissingError(CheckpointError):
    """A file the index names is not in the directory (or the directory is not there)."""


class Folder:
    """An open checkpoint directory: every file is opened relative to it, never through a link."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.fd = os.open(root, _DIR)
        except FileNotFoundError:
            raise MissingError(f"no checkpoint at {root}: the directory does not exist") from None
        except (OSError, ValueError) as e:
            if isinstance(e, NotADirectoryError):
                raise CheckpointError(f"no checkpoint at {root}: it is not a directory") from None
            raise CheckpointError(f"cannot open checkpoint {root}: {cause(e)}") from None
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def replaced(self) -> bool:
        """Whether the path now names another directory (a save swapped it in since we opened)."""
        try:
            st = os.stat(self.root)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity

    def regular(self, name: str, what: str) -> os.stat_result:
        """``lstat`` of ``name``: refuses anything but a regular file with one link."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            raise MissingError(f"{what}: file {name} is missing") from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{what}: cannot read file {name}: {cause(e)}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(
                f"{what}: {name} is {kind(st.st_mode)}, not a regular file; a checkpoint holds only "
                "the files it wrote, and nothing outside its directory is read"
            )
        if st.st_nlink != 1:
            raise CheckpointError(
                f"{what}: file {name} has {st.st_nlink} hard links, so it may be a file outside the "
                "checkpoint; a checkpoint's files have one (copy checkpoints with cp -r, not cp -l)"
            )
        return st

    @contextmanager
    def open(self, name: str, what: str, expected: os.stat_result) -> Iterator[int]:
        """A read descriptor of ``name``, the same regular file ``expected`` described."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except FileNotFoundError:
            raise MissingError(f"{what}: file {name} is missing") from None
        except (OSError, ValueError) as e:
            if isinstance(e, OSError) and e.errno == errno.ELOOP:
                raise CheckpointError(f"{what}: {name} is a symbolic link, not a regular file") from None
            raise CheckpointError(f"{what}: cannot read file {name}: {cause(e)}") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mode) != (
                expected.st_dev,
                expected.st_ino,
                expected.st_size,
                expected.st_mode,
            ):
                raise CheckpointError(f"{what}: file {name} changed while it was being read")
            yield fd
        finally:
            os.close(fd)


def read_exactly(fd: int, n: int, what: str, name: str) -> bytes:
    """``n`` bytes from ``fd`` and then the end of the file; anything else means it changed."""
    out = bytearray()
    try:
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                break
            out += chunk
        extra = os.read(fd, 1)
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read file {name}: {cause(e)}") from None
    if len(out) != n or extra:
        raise CheckpointError(f"{what}: file {name} changed while it was being read")
    return bytes(out)


def read_into(fd: int, buf: memoryview, what: str, name: str) -> None:
    """Fill ``buf`` from ``fd``'s current position, then expect the end of the file."""
    done = 0
    try:
        while done < len(buf):
            got = os.readv(fd, [buf[done:]])
            if got == 0:
                break
            done += got
        extra = os.read(fd, 1)
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read file {name}: {cause(e)}") from None
    if done != len(buf) or extra:
        raise CheckpointError(f"{what}: file {name} changed while it was being read")


# -- writing ----------------------------------------------------------------------------------
def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte (``os.write`` may write fewer than asked)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


class BlockWriter:
    """A file-like sink for ``numpy.lib.format.write_array``: hashes and counts what it writes."""

    def __init__(self, fd: int, digest: object) -> None:
        self.fd, self.digest, self.size = fd, digest, 0

    def write(self, data: bytes | memoryview) -> int:
        write_all(self.fd, data)
        self.digest.update(data)  # type: ignore[attr-defined]
        n = memoryview(data).nbytes
        self.size += n
        return n


def create(dir_fd: int, name: str) -> int:
    """A new file ``name`` in the directory ``dir_fd``, for writing (never an existing one)."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | _CLOEXEC, 0o644, dir_fd=dir_fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, _DIR)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems cannot sync a directory
        pass
    finally:
        os.close(fd)


@contextmanager
def locked(parent: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``parent`` while saving into it; yields whether it is held.

    Saves into one directory take turns, so one never cleans up another's files in progress.
    """
    try:
        fd = os.open(parent, _DIR)
    except OSError:  # a parent we may write but not list: save unlocked
        yield False
        return
    try:
        held = False
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = True
            except OSError:  # e.g. ENOLCK on some network file systems: save unlocked
                pass
        yield held
    finally:
        os.close(fd)  # closing the descriptor releases the lock


_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic rename; False where the system cannot."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - Linux only
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:  # pragma: no cover - very old C library
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # pragma: no cover - file system without it
        return False
    raise OSError(err, os.strerror(err), str(b))


def own_files(directory: Path) -> list[str]:
    """The entries of ``directory`` a checkpoint writes: its index and files named like blocks."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [n for n in names if n == INDEX or BLOCK_NAME.fullmatch(n)]


def remove(directory: Path, names: Iterable[str]) -> None:
    """Delete ``names`` (never following a link) and then ``directory`` if that left it empty.

    Anything else in it stays, and so does the directory: only a checkpoint's own files go.
    A directory that cannot be opened (a save's own, made unreadable by the umask) is still
    removed if it is empty.
    """
    try:
        fd = os.open(directory, _DIR | NOFOLLOW)
    except OSError:
        with suppress(OSError):  # rmdir never follows a link: a link here stays
            os.rmdir(directory)
        return
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    with suppress(OSError):
        os.rmdir(directory)


def strays(parent: Path, name: str) -> list[Path]:
    """``.name.tmp-*`` and ``.name.old-*`` directories an interrupted save of ``name`` left."""
    pattern = re.compile(rf"\.{re.escape(name)}\.(?:tmp|old)-[0-9a-f]{{12}}")
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    out = []
    for entry in sorted(entries):
        if pattern.fullmatch(entry):
            path = parent / entry
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    out.append(path)
            except OSError:
                pass
    return out

"""Files shardsim writes where it is told to (``--chrome-trace``, ``--png``, ``export_chrome_trace``).

They are written as a checkpoint writes its own (:mod:`shardsim._files`): into a fresh
file beside the target, opened relative to the folder's descriptor with ``O_EXCL | O_NOFOLLOW``,
then renamed over the target in one step. So a symbolic link planted at the path is replaced,
never written through (nor is a dangling link's target created), a FIFO there cannot block the
write, and a reader sees the old file or the whole new one, never half of it.

:func:`output_problem` says up front why a path cannot be written (its folder is missing, it is
a folder, a link, a FIFO...), so the command line refuses it before any work.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_output(d / "a.json", b"{}")
>>> (d / "a.json").read_bytes()
b'{}'
>>> (d / "b.json").symlink_to(d / "a.json")
>>> output_problem(d / "b.json")
'is a symbolic link; give the path of a regular file (a link is never written through)'
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from pathlib import Path

from ._files import DIRECTORY, cause, create, fsync_dir, kind, write_all


def output_problem(path: str | os.PathLike[str], suffix: str = ".json") -> str | None:
    """Why ``path`` cannot be written as an output file, in words after the path; None if it can.
    ``suffix`` is the kind of file, for the example name a message gives.

    >>> output_problem("")
    'is empty; give a file name, e.g. out.json'
    """
    text = os.fspath(path)
    if not text:
        return f"is empty; give a file name, e.g. out{suffix}"
    if "\0" in text:
        return "contains a NUL byte; give a file name without one"
    target = Path(os.path.abspath(text))
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return f"cannot be checked: {cause(e)}"
    if st is not None and stat.S_ISDIR(st.st_mode):
        example = os.path.join(text, "out" + (target.suffix or suffix))
        return f"is a folder; give a file name, e.g. {example}"
    if st is not None and not stat.S_ISREG(st.st_mode):
        why = " (a link is never written through)" if stat.S_ISLNK(st.st_mode) else ""
        return f"is {kind(st.st_mode)}; give the path of a regular file{why}"
    folder = target.parent
    if not folder.is_dir():
        return f"cannot be written: the folder {str(folder)!r} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot be written: the folder {str(folder)!r} is not writable"
    return None


def write_output(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, never through a link nor into a FIFO or a device.

    An :class:`OSError` (``e.strerror`` in words, ``e.filename`` the path) when ``path`` is not
    writable (:func:`output_problem`) or the system refuses; the target is then left as it was.
    """
    problem = output_problem(path)
    if problem is not None:
        raise OSError(errno.EINVAL, problem, os.fspath(path))
    target = Path(os.path.abspath(os.fspath(path)))
    folder_fd = os.open(target.parent, DIRECTORY)  # links among the folders are the user's own
    tmp = f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        fd = create(folder_fd, tmp)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        # rename replaces whatever is at the name (a link put there since the check included)
        os.rename(tmp, target.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):  # the target is left as it was
            os.unlink(tmp, dir_fd=folder_fd)
        raise
    finally:
        os.close(folder_fd)
    fsync_dir(target.parent)

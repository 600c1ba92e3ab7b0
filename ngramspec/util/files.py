"""Crash-safe files, shared by the CLI and the evaluation harness.

    write_atomic(path, text)            # all or nothing: readers never see half a file
    write_output(path, text)            # the same for files; devices, FIFOs, /dev/stdout written through
    with exclusive_lock(lock):          # one run per output; a second one fails at once
        ...
    text, style = split_style(raw)      # what the model sees: no BOM, LF line ends
    apply_style(result, style)          # and back: the input's BOM and CRLF restored
    with RecordLog(path) as log:        # finished work, one JSON line each, kept as it completes
        log.append({"index": 3, "text": "..."})
    read_jsonl([path, ...])             # every complete record; a torn last line is skipped

A long job (a document of many chunks, a harness run of many items) appends each finished unit
to a :class:`RecordLog` at once, so an interrupted job loses at most the unit in flight and a
rerun reads the log back to skip what is done (resume). Final outputs go through
:func:`write_atomic` (the CLI's through :func:`write_output`, which writes devices and FIFOs
through instead), so an interruption leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


def write_atomic(path, text: str) -> None:
    """Write via a temporary file in the same folder and a rename: all or nothing. An existing
    file's permissions carry over (a rewritten script stays executable); a new file gets the
    permissions a plain ``open(path, "w")`` would give it, not the temporary file's 0600."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a power cut leaves old or new, not empty
        if path.exists():
            shutil.copymode(path, temp)
        else:
            os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_target(path) -> Path | None:
    """The file that writing ``path`` replaces: ``path``, or the end of its symlink chain (the
    link stays a link); None when it must be written through instead of replaced: a device
    (/dev/null, /dev/full), a FIFO, or a process's open file (/dev/stdout, /dev/fd/N), whose
    node a rename would swap for a regular file."""
    path = Path(path)
    for _ in range(40):  # the kernel's own limit on links followed
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):
            return None
        if not path.is_symlink():
            return path
        if Path(os.path.realpath(path.parent)).joinpath(path.name).is_relative_to("/proc"):
            return None  # /dev/stdout -> /proc/self/fd/1, /dev/fd/N (/dev/fd -> /proc/self/fd) -> ...
        path = path.parent / os.readlink(path)  # a relative link is relative to its own folder
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))


def write_output(path, text: str) -> None:
    """Write ``text`` to ``path`` as an output file: atomically (:func:`write_atomic`) on the
    file :func:`write_target` names, else opened and written through."""
    target = write_target(path)
    if target is not None:
        write_atomic(target, text)
        return
    # Appending: a device or FIFO does not care, and a shell's `-o /dev/stdout >> log` (the
    # file behind /proc/self/fd/1) must not be truncated by opening it again.
    with open(path, "a", encoding="utf-8", newline="") as out:
        out.write(text)


@contextlib.contextmanager
def exclusive_lock(path):
    """Hold an exclusive lock on ``path`` (created, and removed on release) for the block;
    :class:`BlockingIOError` at once, without waiting, when another process holds it."""
    while True:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(handle)
            raise
        if _same_file(handle, path):
            break
        os.close(handle)  # its holder removed it between our open and lock: lock the new one
    try:
        yield
    finally:
        Path(path).unlink(missing_ok=True)  # before the unlock, so nobody locks a removed file
        os.close(handle)


def _same_file(handle: int, path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(handle).st_ino
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class TextStyle:
    """What a text file spells that a model should neither see nor have to reproduce."""

    bom: bool = False  # starts with a UTF-8 byte-order mark
    crlf: bool = False  # most line breaks are CRLF


def split_style(text: str) -> tuple[str, TextStyle]:
    """``text`` without its byte-order mark and with LF line breaks, and how it was spelled."""
    bom = text.startswith("\ufeff")
    crlf = text.count("\r\n") * 2 > text.count("\n")
    return text.removeprefix("\ufeff").replace("\r\n", "\n"), TextStyle(bom, crlf)


def apply_style(text: str, style: TextStyle) -> str:
    """``text`` spelled like the file ``style`` came from (whatever line breaks it had)."""
    text = text.replace("\r\n", "\n")
    if style.crlf:
        text = text.replace("\n", "\r\n")
    return "\ufeff" + text if style.bom else text


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


def read_jsonl(paths) -> list[dict]:
    """The records of JSONL logs, in order; lines that do not parse (a line torn by a crash)
    are skipped, and missing files hold none."""
    records = []
    for path in paths:
        if not Path(path).is_file():
            continue
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return records


class RecordLog:
    """An append-only JSONL file of finished work; each record is flushed as it is appended.

    Opening one whose last line was torn by a crash first ends that line, so the torn part
    stays one unreadable line instead of swallowing the next record.
    """

    def __init__(self, path):
        self.path = Path(path)
        self._handle = None

    def __enter__(self) -> RecordLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = False
        if self.path.is_file() and self.path.stat().st_size:
            with open(self.path, "rb") as existing:
                existing.seek(-1, os.SEEK_END)
                torn = existing.read(1) != b"\n"
        self._handle = open(self.path, "a", encoding="utf-8")
        if torn:
            self._handle.write("\n")
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()
        self._handle = None

    def append(self, record: dict) -> None:
        """Add ``record`` (to an open log, or opening and closing it for this one record)."""
        if self._handle is None:
            with self:
                self.append(record)
            return
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def read(self) -> list[dict]:
        return read_jsonl([self.path])

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def cache_dir() -> Path:
    """Where ngramspec caches converted models, measured cost curves and resume state:
    ``$NGRAMSPEC_CACHE``, else ``$XDG_CACHE_HOME/ngramspec``."""
    if os.environ.get("NGRAMSPEC_CACHE"):
        return Path(os.environ["NGRAMSPEC_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ngramspec"

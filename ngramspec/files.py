"""Crash-safe files, shared by the CLI and the evaluation harness.

    write_atomic(path, text)            # all or nothing: readers never see half a file
    with RecordLog(path) as log:        # finished work, one JSON line each, kept as it completes
        log.append({"index": 3, "text": "..."})
    read_jsonl([path, ...])             # every complete record; a torn last line is skipped

A long job (a document of many chunks, a harness run of many items) appends each finished unit
to a :class:`RecordLog` at once, so an interrupted job loses at most the unit in flight and a
rerun reads the log back to skip what is done (resume). Final outputs go through
:func:`write_atomic`, so an interruption leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
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
        if path.exists():
            shutil.copymode(path, temp)
        else:
            os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


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

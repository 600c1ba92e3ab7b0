"""Crash-safe files shared by the CLI and the harness: atomic writes and resumable record logs."""

import os
import stat

import pytest

from ngramspec import files


def test_write_atomic_replaces_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    files.write_atomic(path, "first\r\n")
    assert path.read_bytes() == b"first\r\n"  # newlines written as given
    path.chmod(0o755)
    files.write_atomic(path, "second")
    assert path.read_text() == "second" and stat.S_IMODE(path.stat().st_mode) == 0o755  # mode kept

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomic(path, "third")
    assert path.read_text() == "second"  # the old content, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temporary file left


def test_a_new_file_gets_ordinary_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "new.txt", "x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644  # not mkstemp's 0600


def test_record_log_resumes_past_a_torn_line(tmp_path):
    log = files.RecordLog(tmp_path / "run" / "items.jsonl")
    assert log.read() == []  # nothing yet, and no file needed
    log.append({"index": 0})  # opens, appends, closes
    with log:
        log.append({"index": 1})
    with open(log.path, "a") as handle:
        handle.write('{"index": 2, "te')  # killed in the middle of a record
    assert log.read() == [{"index": 0}, {"index": 1}]
    with log:  # the rerun appends after ending the torn line
        log.append({"index": 2})
    assert log.read() == [{"index": 0}, {"index": 1}, {"index": 2}]
    other = tmp_path / "run" / "other.jsonl"
    files.RecordLog(other).append({"index": 3})
    assert files.read_jsonl([log.path, other, tmp_path / "missing.jsonl"])[-2:] == [{"index": 2}, {"index": 3}]
    log.clear()
    assert not log.path.exists() and log.read() == []

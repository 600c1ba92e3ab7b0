"""Crash-safe files shared by the CLI and the harness: atomic writes and resumable record logs."""

import errno
import os
import stat
import threading

import pytest

from ngramspec.util import files


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


def test_write_output_writes_devices_and_fifos_through(tmp_path, no_renames):
    files.write_output("/dev/null", "text")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # still the device, not a regular file
    with pytest.raises(OSError) as err:
        files.write_output("/dev/full", "text")
    assert err.value.errno == errno.ENOSPC and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert files.write_target("/dev/stdout") is None  # pytest's captured fd 1: a file behind /proc

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    files.write_output(fifo, "through\r\n")
    reader.join(timeout=10)
    assert received == [b"through\r\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_write_output_replaces_a_symlinks_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "doc.txt"
    target.write_text("old")
    (tmp_path / "hop").symlink_to("real/doc.txt")  # relative, and a chain of two
    link = tmp_path / "link.txt"
    link.symlink_to("hop")
    assert files.write_target(link) == tmp_path / "real" / "doc.txt"
    files.write_output(link, "new")
    assert link.is_symlink() and os.readlink(link) == "hop" and (tmp_path / "hop").is_symlink()
    assert target.read_text() == "new"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to("real/new.txt")
    files.write_output(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "real" / "new.txt").read_text() == "made"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["doc.txt", "new.txt"]  # no temporary file


def test_exclusive_lock_refuses_a_second_holder_at_once(tmp_path):
    lock = tmp_path / ".out.txt.lock"
    with files.exclusive_lock(lock):
        assert lock.exists()
        with pytest.raises(BlockingIOError):
            with files.exclusive_lock(lock):
                pass
    assert not lock.exists()  # removed on release
    with files.exclusive_lock(lock):  # and free again
        pass


@pytest.mark.parametrize("raw, plain, bom, crlf", [
    ("a\nb\n", "a\nb\n", False, False),
    ("\ufeffa\r\nb\r\n", "a\nb\n", True, True),
    ("a\r\nb", "a\nb", False, True),
    ("a\r\nb\nc\nd\n", "a\nb\nc\nd\n", False, False),  # mostly LF: written back with LF
])
def test_text_style_round_trips(raw, plain, bom, crlf):
    text, style = files.split_style(raw)
    assert (text, style) == (plain, files.TextStyle(bom, crlf))
    if raw.count("\r\n") in (0, raw.count("\n")):  # not mixed
        assert files.apply_style(text, style) == raw
    assert files.apply_style("x\r\ny\n", style) == ("\ufeff" if bom else "") + ("x\r\ny\r\n" if crlf else "x\ny\n")


def test_an_output_behind_an_open_descriptor_is_appended_to_not_truncated(tmp_path, no_renames):
    """`ngramspec ... -o /dev/stdout >> log`: the log's earlier lines stay."""
    log = tmp_path / "log.txt"
    log.write_text("earlier line\n")
    with open(log, "a") as shell_redirect:
        for path in (f"/proc/self/fd/{shell_redirect.fileno()}", f"/dev/fd/{shell_redirect.fileno()}"):
            assert files.write_target(path) is None
            files.write_output(path, "the rewrite\n")
    assert log.read_text() == "earlier line\nthe rewrite\nthe rewrite\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]

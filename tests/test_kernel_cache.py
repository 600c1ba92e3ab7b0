"""Cached kernels older than the newest kernel source are dropped (ngramspec.draft.kernel_cache):
Numba checks a cached kernel only against its own file, not the callees it compiled in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ngramspec.draft.kernel_cache import drop_stale


def touch(path: Path, mtime: float, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def test_only_caches_older_than_the_newest_kernel_source_are_dropped(tmp_path):
    now = 1_700_000_000.0
    touch(tmp_path / "vllm" / "kernels.py", now)  # the caller's file, unchanged
    touch(tmp_path / "draft" / "sessions.py", now + 100)  # a callee's file, edited since
    caller = touch(tmp_path / "vllm" / "__pycache__" / "kernels.propose_rows-17.py311.nbi", now + 50)
    caller_code = touch(tmp_path / "vllm" / "__pycache__" / "kernels.propose_rows-17.py311.1.nbc", now + 50)
    fresh = touch(tmp_path / "draft" / "__pycache__" / "sessions.draft_rows-218.py311.nbi", now + 200)
    bytecode = touch(tmp_path / "draft" / "__pycache__" / "sessions.cpython-311.pyc", now)  # not Numba's
    other = touch(tmp_path / "app" / "__pycache__" / "cli.x.nbi", now)  # no kernels there
    touch(tmp_path / "app" / "cli.py", now + 500)  # not a kernel source

    assert drop_stale(tmp_path) == 2
    assert not caller.exists() and not caller_code.exists()
    assert fresh.exists() and bytecode.exists() and other.exists()
    assert drop_stale(tmp_path) == 0  # nothing stale is left


def test_a_package_without_kernel_sources_drops_nothing(tmp_path):
    touch(tmp_path / "draft" / "__pycache__" / "x.nbi", 1.0)
    assert drop_stale(tmp_path) == 0


def test_importing_the_drafter_leaves_no_cache_older_than_its_sources():
    """In a fresh interpreter, after ``import ngramspec.draft``: every cached kernel of this
    checkout is at least as new as the newest kernel source (a stale one was dropped)."""
    package = Path(__file__).resolve().parents[1] / "ngramspec"
    code = ("import ngramspec.draft, pathlib; p = pathlib.Path(ngramspec.draft.__file__).parents[1]; "
            "folders = [p / f for f in ('cost', 'draft', 'vllm')]; "
            "newest = max(s.stat().st_mtime for f in folders for s in f.glob('*.py')); "
            "print(sum(c.stat().st_mtime < newest for f in folders for c in (f / '__pycache__').glob('*.nb[ic]')))")
    stale = touch(package / "draft" / "__pycache__" / "kernel_cache_test.stale.nbi", 1.0)  # older than any source
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "0"
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)

"""Numba's cache of a compiled kernel is checked against the file the kernel is defined in, and
no other. Yet a kernel's machine code holds every callee it compiled in from other files: the
vLLM step (``vllm/kernels.py``) holds the drafting engine (``draft/sessions.py``), which holds
the n-gram index (``draft/index.py``), and so on. After an edit or a ``git pull`` that changes
only a callee's file, the caller's cache would go on running the old code, silently (measured:
the vLLM step kept an edit of ``sessions.py`` out until ``kernels.py`` changed too).

:func:`drop_stale` deletes every cached kernel older than the newest kernel source, when
``ngramspec.draft`` is first imported, before any kernel loads; they compile again (for a
transformers request, in a second process while it decodes: :mod:`~ngramspec.draft.compiling`).
A fresh install writes every file anew, so it drops nothing there. Caches kept elsewhere
(``NUMBA_CACHE_DIR``, or a read-only install) are left alone.
"""

from __future__ import annotations

from pathlib import Path

KERNEL_FOLDERS = ("cost", "draft", "vllm")  # the package's folders that define kernels
PACKAGE = Path(__file__).resolve().parents[1]


def drop_stale(package: Path = PACKAGE) -> int:
    """Delete the Numba cache files (``__pycache__/*.nbi`` and ``*.nbc``) of ``package``'s kernel
    folders that are older than its newest kernel source; returns how many. A file another
    process removed or rewrote meanwhile is skipped: the worst a race costs is a recompile."""
    folders = [package / name for name in KERNEL_FOLDERS]
    sources = [path.stat().st_mtime for folder in folders for path in folder.glob("*.py")]
    if not sources:
        return 0
    newest, dropped = max(sources), 0
    for folder in folders:
        for path in (folder / "__pycache__").glob("*.nb[ic]"):
            try:
                if path.stat().st_mtime < newest:
                    path.unlink()
                    dropped += 1
            except OSError:
                continue
    return dropped

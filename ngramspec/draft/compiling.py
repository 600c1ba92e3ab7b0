"""The drafting kernels on a fresh install: compiled by a second process while requests decode.

Numba compiles the kernels a transformers request calls once per install (``cache=True``):
about 8 s on a 2-core CPU, almost all of it Numba's type inference, in Python. Every later
process loads them from the cache in about 0.4 s. A thread cannot hide those 8 s: it holds the
GIL, which the decode loop needs between the model's operations (beside one, a 96-token plain
generate of the default model took 10-16 s instead of 2.6 s). Splitting the work over two
processes does not pay either: the kernels share most of their callees (9.2 s against 7.6 s).

So on a cold cache the first :class:`~ngramspec.draft.speculator.NgramSpeculator` starts
``python -m ngramspec.draft.compiling``, which compiles every kernel into the cache at the lowest
CPU priority (nice 19), and returns at once. A request that starts before that process ends gets
a :class:`PendingSession`: it proposes nothing (plain steps, exact as ever: a draft never changes
the output) and turns into a real session at its first step after the process has ended, when
this process loads the kernels from the cache (and with them, a history's index kernels).

The priority is the trade (default model, 2-core CPU, torch's 2 threads): beside the compiling
process, plain generates back to back ran 1.19x slower than alone at nice 19 and the compile
ended after 75 s of them; at nice 10, 2x slower and 17.5 s; at nice 5, 5.5x and 9.7 s; with
torch on one thread beside it at nice 0, 1.6x and 9 s. Requests are seldom back to back: the
process runs in the gaps, and a first generate of 96 tokens ended 2.2 s after a warm one, where
compiling first costs 6.7 s (``eval/results/coldstart``). A request that runs entirely while
the kernels compile does not join a speculator's history.

``NGRAMSPEC_COMPILE=foreground`` compiles in this process instead, before the speculator
returns, as on one core, or when the second process fails (the evaluation harness and the tests
set it: their first request must draft).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import numpy as np

from .proposal import Draft, as_token_array

logger = logging.getLogger("ngramspec")
_lock = threading.Lock()
_compiler: subprocess.Popen | None = None  # the second process, while it runs
_ready = False  # every kernel a request calls is loaded in this process
_with_index = False  # ... and the n-gram index's own (a speculator with a history)


def prepare(with_index: bool = False) -> None:
    """Make the kernels ready, or start compiling them in a second process (module doc)."""
    global _compiler, _with_index
    from .index import warm_up as warm_up_index
    from .sizing import warm_up as warm_up_sizing

    with _lock:
        _with_index = _with_index or with_index
        if _ready:  # the engine's kernels are loaded; a history's index may still need its own
            if with_index:
                warm_up_index()
            return
        if _compiler is not None:  # still compiling: _load() warms the index too, once it ends
            return
        warm_up_sizing()  # the smallest kernel: did it come from the cache?
        if _cache_was_cold() and _background_allowed():
            _compiler = _start_compiler()
            if _compiler is not None:
                logger.warning("ngramspec: compiling the drafting kernels in a second process (once per "
                               "install, about 10 s on 2 cores); requests decode without drafts until then")
                return
        _load()


def ready() -> bool:
    """True once the kernels are loaded here; at the first call after the second process ended,
    loads them (from the cache it wrote; if it failed, this process compiles them)."""
    global _compiler
    if _ready:
        return True
    with _lock:
        if _compiler is not None and _compiler.poll() is None:
            return False
        _compiler = None
        _load()
    return True


def wait() -> None:
    """Block until the kernels are ready (a caller whose first request must draft)."""
    with _lock:
        compiler = _compiler
    if compiler is not None:
        compiler.wait()
    ready()


def _load() -> None:
    """Every kernel once (from the cache, or compiled here); the caller holds the lock."""
    global _ready
    from .index import warm_up as warm_up_index
    from .session import warm_up as warm_up_engine
    from .sizing import warm_up as warm_up_sizing

    warm_up_sizing()
    warm_up_engine()
    if _with_index:
        warm_up_index()
    _ready = True


def _cache_was_cold() -> bool:
    from .sizing import padded_lengths

    stats = padded_lengths.stats
    return sum(stats.cache_misses.values()) > 0 and sum(stats.cache_hits.values()) == 0


def _background_allowed() -> bool:
    if os.environ.get("NGRAMSPEC_COMPILE", "background") == "foreground":
        return False
    if not os.path.basename(sys.executable or "").lower().startswith("python"):  # embedded: no interpreter to start
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores >= 2


def _start_compiler():
    # The package's own folder first, so the second process imports this very copy of it.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.Popen([sys.executable, "-m", "ngramspec.draft.compiling"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None


class PendingSession:
    """A request's session while the kernels compile (module doc): it keeps the tokens, proposes
    nothing, and hands every call to a real session (``make(prompt)``) from the first
    :meth:`propose` after the kernels are ready. ``pending_steps``: the steps it proposed nothing
    because they were not."""

    def __init__(self, config, prompt_ids, make):
        self.config = config
        self.pending_steps = 0
        self._tokens = [as_token_array(prompt_ids)]
        self._make, self._session = make, None

    def propose(self, max_tokens=None, sized: bool = True, tree: bool = True) -> Draft:
        if self._session is None and ready():
            self._session = self._make(np.concatenate(self._tokens))
        if self._session is not None:
            return self._session.propose(max_tokens, sized=sized, tree=tree)
        self.pending_steps += 1
        return Draft(np.zeros(0, dtype=np.int32))

    def extend(self, accepted_tokens, verified: int | None = None) -> None:
        if self._session is not None:
            self._session.extend(accepted_tokens, verified=verified)
        else:
            self._tokens.append(as_token_array(accepted_tokens))

    @property
    def tokens(self) -> np.ndarray:
        """The stream so far (prompt followed by every extended token)."""
        return self._session.tokens if self._session is not None else np.concatenate(self._tokens)

    def finish(self) -> None:
        if self._session is not None:
            self._session.finish()


def entry_point(kernel, args):
    """The compiled entry point of ``kernel`` (a Numba dispatcher) for ``args``' types, compiled
    or loaded from the cache if none is yet: a call to it skips the dispatcher's typing of every
    argument (~0.04 us an array, ~0.4 us a typed list; ~0.9 us of a vLLM step's 26 arguments).
    The caller must call it with arguments of those types only (an array of another dtype or
    number of dimensions would be read as this one's)."""
    import numba

    return kernel.compile(tuple(numba.typeof(a) for a in args))


if __name__ == "__main__":
    if hasattr(os, "nice"):
        os.nice(19)  # the requests first: this process takes what they leave
    _load()

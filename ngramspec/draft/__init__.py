"""Layer 2, draft: everything that decides a draft, without a model.

Owns the settings (``config``), the n-gram index (``index``), the shared history (``history``),
per-position acceptance (``acceptance``), the sizing rule (``sizing``), what a draft is
(``proposal``), and the one drafting engine: every request a slot of ``sessions`` (vLLM's rows
and transformers' requests alike), its candidates (``candidates``), fuzzy re-alignment
(``realign``), learned edits (``edits``) and token trees (``tree``); one request's session over
a slot (``session``), the sizing of a padded batch and the fixed cost model (``tuning``), the
speculator (``speculator``), the verify rule's walk over recorded tokens (``walk``), per-run
stats (``metrics``) and the trace replayer (``replay``). The engine's pure-Python reference is
``tests/reference_session.py``. Importing it first drops cached kernels older than the newest
kernel source (``kernel_cache``: Numba checks only a kernel's own file).

May import: cost, util; numpy, numba and rapidfuzz. Never torch or transformers (drafting runs
on the host and in a vLLM worker; the layering test checks), nor hf, vllm or app.
"""

from .kernel_cache import drop_stale

drop_stale()

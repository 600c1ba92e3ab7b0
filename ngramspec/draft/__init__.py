"""Layer 2, draft: everything that decides a draft, without a model.

Owns the settings (``config``), the n-gram index (``index``), the shared history (``history``),
per-position acceptance (``acceptance``), the sizing rule (``sizing``), what a draft is
(``proposal``), one request's session (``session``), the sizing of a padded batch and the
fixed cost model (``tuning``), the speculator (``speculator``), many sessions in arrays for
vLLM (``sessions``), the verify rule's walk over recorded tokens (``walk``), per-run stats
(``metrics``) and the trace replayer (``replay``).

May import: cost, util; numpy, numba and rapidfuzz. Never torch or transformers (drafting runs
on the host and in a vLLM worker; the layering test checks), nor hf, vllm or app.
"""

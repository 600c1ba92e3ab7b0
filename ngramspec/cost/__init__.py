"""Layer 1, cost: what a forward (or a vLLM engine step) over q tokens costs relative to one.

Owns the measured curves and priors and a model's curve measured once and cached (``curves``),
the online cost model that refines a prior from timed forwards and engine steps, and its
tuning (``costmodel``), its compiled line fit (``fit``) and the decode loop's forward timer
(``timer``).

May import: util; numpy and numba. torch and transformers only inside the functions that
measure or time a model (``curves.measure_cost_curve``, ``timer.ForwardTimer`` on CUDA), never
at module level. Never draft, hf, vllm or app.
"""

"""Layer 3, hf: ngramspec in transformers.

Owns the ``generate()`` hook and its explicit install (``hook``), the request checks
(``checks``), the once-per-model self-test of the loop's steps (``probe``), the decode loop
for one row or a batch (``decode``), the verify step on logits
(``verify``), the model and its cache as the loop's target (``target``), host-to-device copies
(``transfer``) and model loading (``models``).

May import: draft, cost, util; torch and transformers. Never vllm (a vLLM worker must not load
the transformers side) or app.
"""

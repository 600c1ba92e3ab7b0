"""Layer 4, app: the ``ngramspec rewrite|summarize`` command and what it is built from.

Owns the command line (``cli``) and the processing of each document of a run (``process``),
document jobs over chunks (``documents``) and their settings (``settings``), chunking along
natural boundaries (``chunking``), the drift and loop guards (``guard``) and sharding over
processes or GPUs (``jobs``).

May import: hf, draft, cost, util; torch, transformers, accelerate and tqdm. Never vllm.
"""

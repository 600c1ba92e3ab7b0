"""Helpers of the vLLM tests (``make test-vllm``, in ``.venv-vllm``): ngramspec as vLLM's
``custom_class`` drafter on the CPU build, against the same engine without speculation.
tests/conftest.py leaves this folder out where vLLM is not installed (the main venv)."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the CPU default reserves most of RAM

NGRAMSPEC = {"method": "custom_class", "model": "ngramspec.vllm.Proposer", "num_speculative_tokens": 16}


def model_dir() -> str:
    from ngramspec.models import default_model_dir

    return str(default_model_dir())


def make_llm(model_dir: str, speculative_config=None, max_num_seqs: int = 16, **kwargs):
    from vllm import LLM

    return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=4096,
               max_num_seqs=max_num_seqs, speculative_config=speculative_config,
               disable_log_stats=False, **kwargs)  # stats on: the tests read the speculation counters


def spec_counters(llm) -> dict:
    from eval.vllm_bench import spec_counters as counters

    return counters(llm)

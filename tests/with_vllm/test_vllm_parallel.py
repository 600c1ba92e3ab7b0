"""Tensor parallel 2 on the CPU build: every worker of the last pipeline stage builds its own
ngramspec drafter and proposes the same drafts from the same rows; vLLM uses those of
tensor-parallel rank 0. Greedy outputs equal the same two-worker engine without speculation."""

from __future__ import annotations

import gc
import os

import pytest
from vllm_helpers import NGRAMSPEC, make_llm, spec_counters
from vllm_helpers import model_dir as default_model_folder

import tasks

SETS = ("jfleg", "humanevalfix", "xsum", "iterater_human")


@pytest.fixture(scope="module")
def two_core_binding():
    """One core per worker: vLLM's automatic binding keeps a core back for the front end,
    which a 2-core machine cannot spare for two workers."""
    saved = {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")}
    if (os.cpu_count() or 1) < 2:
        pytest.skip("tensor parallel 2 needs two cores")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def greedy_outputs(speculative_config, prompts):
    from vllm import SamplingParams

    llm = make_llm(default_model_folder(), speculative_config, max_num_seqs=4, tensor_parallel_size=2,
                   distributed_executor_backend="mp")
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=48),
                           use_tqdm=False)
    accepted = spec_counters(llm)["accepted_tokens"]
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs], accepted


def test_tensor_parallel_two_is_exact(two_core_binding):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_folder())
    prompts = [tasks.prompt_ids(tokenizer, tasks.load_items(name, limit=1)[0]) for name in SETS]
    plain, _ = greedy_outputs(None, prompts)
    speculative, accepted = greedy_outputs(NGRAMSPEC, prompts)
    assert accepted > 10
    assert speculative == plain

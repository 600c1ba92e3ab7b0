"""Tensor parallel 2 on the CPU build: every worker of the last pipeline stage builds its own
ngramspec drafter and proposes the same drafts from the same rows; vLLM uses those of
tensor-parallel rank 0. Greedy outputs equal the same two-worker engine without speculation.

The default model has 9 attention heads, which two workers cannot split, so this test uses a
small random Llama (4 heads, the default model's tokenizer) saved to a temporary folder."""

from __future__ import annotations

import gc
import os

import pytest

import tasks

from vllm_helpers import NGRAMSPEC, make_llm, spec_counters
from vllm_helpers import model_dir as default_model_folder

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


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    """A 2-layer random Llama with 4 heads whose layers barely touch the residual stream (weights
    scaled down) and whose head is the embedding (tied): each position's logits favour its own
    token, so greedy text repeats itself and drafts get accepted."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tp-model")
    tokenizer = AutoTokenizer.from_pretrained(default_model_folder())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed_tokens" not in name:
                p.mul_(0.05)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def greedy_outputs(model, speculative_config, prompts):
    from vllm import SamplingParams

    llm = make_llm(model, speculative_config, max_num_seqs=4, tensor_parallel_size=2,
                   distributed_executor_backend="mp")
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=48),
                           use_tqdm=False)
    accepted = spec_counters(llm)["accepted_tokens"]
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs], accepted


def test_tensor_parallel_two_is_exact(two_core_binding, small_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(small_model)
    prompts = [tasks.prompt_ids(tokenizer, tasks.load_items(name, limit=1)[0]) for name in SETS]
    plain, _ = greedy_outputs(small_model, None, prompts)
    speculative, accepted = greedy_outputs(small_model, NGRAMSPEC, prompts)
    assert accepted > 10
    assert speculative == plain

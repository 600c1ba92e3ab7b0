"""Tensor parallel 2 on the CPU build: every worker of the last pipeline stage builds its own
ngramspec drafter and proposes the same drafts from the same rows; vLLM uses those of
tensor-parallel rank 0. Greedy outputs equal the model's own greedy decoding.

The reference is transformers' greedy ``generate()`` of the same model, certified: one forward
over prompt + reference shows that every reference token leads the runner-up logit by at least
MARGIN, far more than two fp32 implementations of a 2-layer model differ by, so a two-worker
engine without speculation cannot decode differently. Where a position is not certified, that
engine is started and is the reference, as it always was before (one engine start instead of two
in the usual case).

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
MAX_TOKENS = 48
MARGIN = 1e-2  # logits; measured here: every position leads by >= 1.4


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
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    accepted = spec_counters(llm)["accepted_tokens"]
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs], accepted


def certified_greedy(model_folder: str, prompts) -> list[list[int]] | None:
    """transformers' greedy outputs of the model, or None where any token leads its runner-up
    by less than MARGIN (then only an engine without speculation is a safe reference)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(prompt):]
            logits = model(torch.cat([ids[0], out])[None]).logits[0, len(prompt) - 1:-1]  # (new, vocab)
            top2 = logits.topk(2).values
            if not (logits.argmax(-1) == out).all() or (top2[:, 0] - top2[:, 1]).min() < MARGIN:
                return None
            outputs.append(out.tolist())
    return outputs


def test_tensor_parallel_two_is_exact(two_core_binding, small_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(small_model)
    prompts = [tasks.prompt_ids(tokenizer, tasks.load_items(name, limit=1)[0]) for name in SETS]
    speculative, accepted = greedy_outputs(small_model, NGRAMSPEC, prompts)
    assert accepted > 10
    reference = certified_greedy(small_model, prompts)
    if reference is None:
        reference, _ = greedy_outputs(small_model, None, prompts)
    assert all(len(r) == MAX_TOKENS for r in reference)  # no early stop: every step compared
    assert speculative == reference

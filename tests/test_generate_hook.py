"""The transformers glue: generate() unchanged without the speculator, equal with it, on every
entry path (patched generate, custom_generate hook, from_pretrained models) and option."""

import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationMixin, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import ngramspec
from ngramspec import NgramSpeculator

from conftest import PROCESSOR_CASES, assert_accepted, plain_generate

IDS = torch.tensor([[0, 5, 9, 13, 5, 9, 21, 5, 9]])


def test_generate_without_speculator_is_transformers_own(tiny_model):
    assert GenerationMixin.generate._ngramspec_original is not None
    cases = (dict(max_new_tokens=25), dict(max_new_tokens=10, num_beams=2), dict(max_new_tokens=8, do_sample=True))
    for kwargs in cases:
        torch.manual_seed(0)
        ours = tiny_model.generate(IDS, **kwargs)
        torch.manual_seed(0)
        theirs = plain_generate(tiny_model, IDS, **kwargs)
        assert ours.tolist() == theirs.tolist()
    # explicitly None is the same as absent
    assert tiny_model.generate(IDS, max_new_tokens=5, ngram_speculator=None).tolist() == plain_generate(
        tiny_model, IDS, max_new_tokens=5
    ).tolist()


def test_install_is_idempotent_and_reversible(tiny_model):
    wrapped = GenerationMixin.generate
    ngramspec.install()
    assert GenerationMixin.generate is wrapped
    ngramspec.uninstall()
    try:
        assert not hasattr(GenerationMixin.generate, "_ngramspec_original")
        with pytest.raises(ValueError):  # stock transformers rejects the unknown kwarg
            tiny_model.generate(IDS, max_new_tokens=3, ngram_speculator=NgramSpeculator())
        # ...but the official hook still works without the wrapper
        out = tiny_model.generate(IDS, max_new_tokens=20, custom_generate=ngramspec.ngram_generate,
                                  ngram_speculator=NgramSpeculator())
        assert out.tolist() == tiny_model.generate(IDS, max_new_tokens=20).tolist()
    finally:
        ngramspec.install()
    assert hasattr(GenerationMixin.generate, "_ngramspec_original")


# Run in a fresh interpreter: the tests' own process has installed the hook (conftest.py).
IMPORT_PATCHES_NOTHING = textwrap.dedent("""
    from types import SimpleNamespace

    import numpy as np
    from transformers import GenerationMixin

    original = GenerationMixin.generate
    import ngramspec
    assert GenerationMixin.generate is original, "import ngramspec patched generate"
    import ngramspec.vllm
    import ngramspec.vllm.proposer
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=256),
                             scheduler_config=SimpleNamespace(max_num_seqs=2))
    proposer = ngramspec.vllm.Proposer(config)  # what a vLLM worker builds and drives
    tokens = np.tile(np.arange(8, dtype=np.int32), 8)[None, :]
    proposer.propose([[1]], np.array([40]), tokens)
    assert GenerationMixin.generate is original, "the vLLM drafter patched generate"
    ngramspec.install()
    wrapped = GenerationMixin.generate
    assert wrapped is not original and wrapped._ngramspec_original is original
    ngramspec.install()
    assert GenerationMixin.generate is wrapped, "install() is not idempotent"
    ngramspec.uninstall()
    assert GenerationMixin.generate is original
    print("ok")
""")


@pytest.mark.slow
def test_importing_ngramspec_or_its_vllm_drafter_patches_nothing():
    """No patching on import: ``import ngramspec`` and the vLLM drafter (imported, built and
    driven as a vLLM worker does) leave transformers' generate alone; ``install()`` wraps it
    once and ``uninstall()`` restores it."""
    done = subprocess.run([sys.executable, "-c", IMPORT_PATCHES_NOTHING], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_document_job_installs_the_hook(tiny_model):
    from ngramspec.app.documents import DocumentJob

    ngramspec.uninstall()
    try:
        DocumentJob(tiny_model, None, NgramSpeculator())
        assert hasattr(GenerationMixin.generate, "_ngramspec_original")
    finally:
        ngramspec.install()


def test_load_model_installs_the_hook(tiny_model_dir):
    ngramspec.uninstall()
    try:
        model, _ = ngramspec.load_model(str(tiny_model_dir), device="cpu")
        assert hasattr(GenerationMixin.generate, "_ngramspec_original")
        assert model.generate(IDS, max_new_tokens=4, ngram_speculator=NgramSpeculator()).shape == (1, 13)
    finally:
        ngramspec.install()


def test_custom_generate_hook(tiny_model):
    spec = NgramSpeculator()
    expected = plain_generate(tiny_model, IDS, max_new_tokens=40)
    got = tiny_model.generate(IDS, max_new_tokens=40, custom_generate=ngramspec.ngram_generate, ngram_speculator=spec)
    assert got.tolist() == expected.tolist() and spec.last_stats.accepted_tokens > 0


def test_model_from_pretrained_folder(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    spec = NgramSpeculator()
    got = model.generate(IDS, max_new_tokens=40, ngram_speculator=spec)
    assert got.tolist() == plain_generate(tiny_model, IDS, max_new_tokens=40).tolist()
    assert_accepted(spec)


class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.flatten().tolist())

    def end(self):
        self.ends += 1


def test_streamer_gets_prompt_then_every_token_once(tiny_model):
    spec = NgramSpeculator()
    streamer = Recorder()
    got = tiny_model.generate(IDS, max_new_tokens=40, streamer=streamer, ngram_speculator=spec)
    assert streamer.puts[0] == IDS[0].tolist() and streamer.ends == 1
    streamed = [t for chunk in streamer.puts[1:] for t in chunk]
    assert streamed == got[0, IDS.shape[1] :].tolist()
    assert any(len(chunk) > 1 for chunk in streamer.puts[1:])  # drafts arrive as chunks


def test_return_dict_scores_and_logits_match_plain(tiny_model, verify_mode):
    kwargs = dict(max_new_tokens=30, return_dict_in_generate=True, output_scores=True, output_logits=True,
                  repetition_penalty=1.2)
    expected = plain_generate(tiny_model, IDS, **kwargs)
    spec = NgramSpeculator()
    got = tiny_model.generate(IDS, ngram_speculator=spec, **kwargs)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert len(got.scores) == len(expected.scores) == len(got.logits) == 30
    for ours, theirs in zip(got.scores + got.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-9, atol=1e-9)
    assert got.cache.get_seq_length() == got.sequences.shape[1] - 1  # all but the last token
    assert_accepted(spec)


@pytest.mark.parametrize("processor_kwargs", PROCESSOR_CASES)
def test_logits_processors_see_the_right_prefix(tiny_model, processor_kwargs, verify_mode):
    expected = plain_generate(tiny_model, IDS, max_new_tokens=50, **processor_kwargs)
    spec = NgramSpeculator()
    got = tiny_model.generate(IDS, max_new_tokens=50, ngram_speculator=spec, **processor_kwargs)
    assert got.tolist() == expected.tolist()
    if processor_kwargs.get("no_repeat_ngram_size") == 2:
        # Every draft continues a copied n-gram: its first token repeats the bigram (last token,
        # next token) that the processor bans, so none can be accepted. Drafts are still verified.
        assert spec.last_stats.accepted_tokens == 0 < spec.last_stats.drafted_tokens
    else:
        assert_accepted(spec)


class StopAfterToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_user_stopping_criteria_inside_draft(tiny_model):
    reference = plain_generate(tiny_model, IDS, max_new_tokens=60)[0, IDS.shape[1] :].tolist()
    token = reference[len(reference) // 2]
    criteria = StoppingCriteriaList([StopAfterToken(token)])
    expected = plain_generate(tiny_model, IDS, max_new_tokens=60, stopping_criteria=criteria)
    spec = NgramSpeculator()
    got = tiny_model.generate(IDS, max_new_tokens=60, stopping_criteria=criteria, ngram_speculator=spec)
    assert got.tolist() == expected.tolist() and got[0, -1].item() == token
    assert spec.last_stats.stop_reason == "criteria"
    assert_accepted(spec)


def test_static_cache(tiny_model):
    expected = plain_generate(tiny_model, IDS, max_new_tokens=40, cache_implementation="static")
    spec = NgramSpeculator()
    got = tiny_model.generate(IDS, max_new_tokens=40, cache_implementation="static", ngram_speculator=spec)
    assert got.tolist() == expected.tolist() and spec.last_stats.accepted_tokens > 0


class DeviceLogits(torch.Tensor):
    """Logits as if on an accelerator: every tensor computed from them keeps this type, and
    each read of one on the host (there, a host-device sync) is counted."""

    reads = 0
    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.READS:
            cls.reads += 1
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(do_sample=True, temperature=0.3, top_p=0.9),
                                    dict(do_sample=False, repetition_penalty=1.2)])
def test_the_accelerator_path_reads_the_device_once_per_forward(tiny_model, monkeypatch, kwargs):
    """With every position decided at once (the accelerator way, forced here on CPU), a step
    reads its forward's results on the host once: greedy, sampling with warpers, processors."""
    from ngramspec.hf import verify
    from ngramspec.hf.target import HFTarget

    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: True)
    original, forwards = HFTarget.forward, []

    def forward(self, *args, **options):
        forwards.append(1)
        return original(self, *args, **options).as_subclass(DeviceLogits)

    monkeypatch.setattr(HFTarget, "forward", forward)
    DeviceLogits.reads = 0
    spec = NgramSpeculator(min_n=1)
    tiny_model.generate(IDS, max_new_tokens=30, ngram_speculator=spec, **kwargs)
    assert spec.last_stats.accepted_tokens > 0 and len(forwards) == spec.last_stats.target_forwards
    assert DeviceLogits.reads == len(forwards), f"{DeviceLogits.reads} host reads over {len(forwards)} forwards"


def test_a_generate_of_its_own_that_bypasses_the_hook_is_refused(tiny_model):
    """A model class whose own generate() never calls GenerationMixin.generate (MusicGen's) hands
    ngram_speculator to transformers' model-kwargs check: refused there, with the model type named,
    before any forward (the hooked path takes the speculator out before that check)."""
    from ngramspec.hf.checks import UnsupportedGenerationError

    with pytest.raises(UnsupportedGenerationError, match="has its own generate\\(\\).*Generate without"):
        tiny_model._validate_model_kwargs({"ngram_speculator": NgramSpeculator()})
    ngramspec.uninstall()
    try:
        assert not hasattr(GenerationMixin._validate_model_kwargs, "_ngramspec_original")
    finally:
        ngramspec.install()


def test_multimodal_rope_positions_of_a_padded_text_only_batch_are_the_texts():
    """(sections, B, P) position ids of a text-only prompt are the text's at the real tokens; the
    padding's may differ (Qwen omni thinkers fill them with 1): taken. Any real token's differing:
    refused."""
    from ngramspec.hf.checks import UnsupportedGenerationError
    from ngramspec.hf.target import text_positions

    ids = torch.ones(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    text = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    padded_with_one = text.masked_fill(mask == 0, 1)
    assert torch.equal(text_positions(ids, mask, torch.stack([text, padded_with_one, padded_with_one])), text)
    with pytest.raises(UnsupportedGenerationError, match="text positions only"):
        text_positions(ids, mask, torch.stack([text, text + 1, text]))

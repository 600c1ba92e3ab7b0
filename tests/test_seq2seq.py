"""Encoder-decoder models (ngramspec/hf/seq2seq.py): greedy output identical to plain greedy for
one row and a left-padded batch, with drafts accepted and rolled back; drafts copy from the
encoder's input; a static cache too; what cannot be rolled back is refused before the decoder's first forward.
The sweep over every registered encoder-decoder type is `python -m eval compat` (rows "TYPE (seq2seq)").
"""

import pytest
import torch
from transformers.generation import GenerateEncoderDecoderOutput

from eval.compat import prompts
from eval.tiny_models import tiny_model
from ngramspec import NgramSpeculator, UnsupportedGenerationError

from conftest import plain_generate

NEW = 24

# type -> the auto class it is built with: BART and T5 (text-to-text), T5Gemma 2 (image-text-to-text,
# on a text-only prompt; logits_to_keep and decoder positions of its own).
TYPES = {"bart": "seq2seq", "t5": "seq2seq", "t5gemma2": "image-text"}


def _model(model_type: str):
    return tiny_model(model_type, dtype=torch.float64, seed=3, kind=TYPES[model_type])  # (float64: no near-ties)


def _greedy(**kwargs):
    return dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0, **kwargs)


def _rollbacks(stats) -> int:
    return sum(a < d for a, d in zip(stats.accepted_per_step, stats.verified_per_step))


@pytest.mark.parametrize("model_type", list(TYPES))
def test_one_row_is_identical_with_drafts_accepted_and_rolled_back(model_type):
    model = _model(model_type)
    ids, _ = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    expected = plain_generate(model, ids, **_greedy())
    got = model.generate(ids, ngram_speculator=spec, **_greedy())
    assert got.tolist() == expected.tolist() and got.shape[1] == NEW + 1  # the decoder's start token, then NEW
    assert spec.last_stats.accepted_tokens > 0 and _rollbacks(spec.last_stats) > 0, spec.last_stats


@pytest.mark.parametrize("model_type", list(TYPES))
def test_a_left_padded_batch_is_identical(model_type):
    """The encoder's padding is its mask's; each row decodes alone with its slice of the encoder's outputs."""
    model = _model(model_type)
    _, (ids, mask) = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    expected = plain_generate(model, ids, attention_mask=mask, **_greedy())
    got = model.generate(ids, attention_mask=mask, ngram_speculator=spec, **_greedy())
    assert got.tolist() == expected.tolist()
    assert all(s.accepted_tokens > 0 for s in spec.last_row_stats)


def test_drafts_copy_from_the_encoders_input(monkeypatch):
    """Each row's drafter indexes its source without padding, then the decoder's start token:
    the output of a summary or a rewrite copies from the document, not from itself alone."""
    model = _model("bart")
    _, (ids, mask) = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    texts = []
    original = NgramSpeculator.start
    monkeypatch.setattr(NgramSpeculator, "start", lambda self, text, *a: texts.append(text.tolist())
                        or original(self, text, *a))
    model.generate(ids, attention_mask=mask, ngram_speculator=spec, **_greedy())
    start = model.generation_config.decoder_start_token_id
    assert texts == [ids[b][mask[b].bool()].tolist() + [start] for b in range(2)]


def test_return_dict_gives_the_encoder_decoder_output_with_plain_scores():
    model = _model("bart")
    ids, _ = prompts(model)
    kwargs = _greedy(return_dict_in_generate=True, output_scores=True)
    expected = plain_generate(model, ids, **kwargs)
    got = model.generate(ids, ngram_speculator=NgramSpeculator(payoff_sizing=False), **kwargs)
    assert isinstance(got, GenerateEncoderDecoderOutput)
    assert got.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores))
    assert got.cache.get_seq_length() == expected.cache.get_seq_length()


def test_seeded_sampling_does_not_depend_on_the_drafts():
    """Sampling draws each token from exactly the target's distribution with a fixed uniform per
    position: drafts of up to 24 tokens give exactly the tokens of drafts of 1."""
    model = _model("bart")
    ids, _ = prompts(model)
    outputs, accepted = [], []
    for setting in ({}, {"max_draft_tokens": 1}):
        spec = NgramSpeculator(payoff_sizing=False, **setting)
        torch.manual_seed(7)
        outputs.append(model.generate(ids, do_sample=True, temperature=0.3, top_k=3, max_new_tokens=NEW,
                                      min_new_tokens=NEW, eos_token_id=None, pad_token_id=0, ngram_speculator=spec))
        accepted.append(spec.last_stats.accepted_tokens)
    assert outputs[0].tolist() == outputs[1].tolist() and min(accepted) > 0


@pytest.mark.parametrize("model_type", list(TYPES))
def test_a_static_cache_is_identical(model_type):
    """generate() builds static self- and cross-attention caches; the loop crops the decoder's
    (an encoder-decoder cache's own crop refuses a static one), and each row of a batch gets a
    static cache of the same sizes."""
    model = _model(model_type)
    _, (ids, mask) = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    kwargs = _greedy(cache_implementation="static")
    assert model.generate(ids[:1], ngram_speculator=spec, **kwargs).tolist() == \
        plain_generate(model, ids[:1], **kwargs).tolist()
    assert spec.last_stats.accepted_tokens > 0 and _rollbacks(spec.last_stats) > 0
    expected = plain_generate(model, ids, attention_mask=mask, **kwargs)
    assert model.generate(ids, attention_mask=mask, ngram_speculator=spec, **kwargs).tolist() == expected.tolist()


def test_another_decoder_cache_is_refused_before_the_decoders_first_forward():
    from transformers import DynamicCache, EncoderDecoderCache

    class OwnCache(DynamicCache):  # a cache the loop does not know how to roll back
        pass

    model = _model("bart")
    ids, _ = prompts(model)
    calls = []
    model.get_decoder().register_forward_hook(lambda *a: calls.append(1))
    cache = EncoderDecoderCache(OwnCache(), DynamicCache())
    with pytest.raises(UnsupportedGenerationError, match="rolls back an encoder-decoder's dynamic or static cache"):
        model.generate(ids, ngram_speculator=NgramSpeculator(), cache=cache, **_greedy())
    assert calls == []


def test_self_draft_layers_leave_an_encoder_decoder_to_its_copies():
    """Self-speculation runs a decoder-only model's first layers; an encoder-decoder drafts
    from its copies alone, and stays identical."""
    model = _model("bart")
    ids, _ = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False, self_draft_layers=1)
    got = model.generate(ids, ngram_speculator=spec, **_greedy())
    assert got.tolist() == plain_generate(model, ids, **_greedy()).tolist()
    assert spec.last_stats.self_drafted_tokens == 0 and spec.last_stats.accepted_tokens > 0


def test_load_model_loads_an_encoder_decoder_and_the_document_tool_says_it_cannot_prompt_one(
        tiny_model_dir, tmp_path, cache_env, monkeypatch, capsys):
    """load_model() takes an encoder-decoder folder (AutoModelForSeq2SeqLM) for model.generate();
    `ngramspec summarize` prompts through a chat template and refuses it with a clear message."""
    from transformers import AutoTokenizer

    from ngramspec.app import cli as cli_module
    from ngramspec.hf.models import load_model

    from conftest import call_main

    folder = tmp_path / "tiny-bart"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tiny_model("bart", kind="seq2seq", vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model, _ = load_model(str(folder), device="cpu")
    assert model.config.is_encoder_decoder and type(model).__name__ == "BartForConditionalGeneration"
    document = tmp_path / "notes.txt"
    document.write_text("A short note about the weather. It rained all day.")
    monkeypatch.setenv("NGRAMSPEC_CACHE", cache_env["NGRAMSPEC_CACHE"])
    code, _, err = call_main(cli_module.main, ["summarize", str(document), "--model", str(folder), "--quiet"], capsys)
    assert code == 2 and "BartForConditionalGeneration is an encoder-decoder" in err and "Traceback" not in err

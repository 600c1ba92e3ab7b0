"""Every unsupported request fails before any forward pass, with a message saying what to do."""

import pytest
import torch
from transformers import ClassifierFreeGuidanceLogitsProcessor, GenerationConfig, StoppingCriteria, StoppingCriteriaList

import ngramspec
from ngramspec import NgramSpeculator, UnsupportedGenerationError

IDS = torch.tensor([[0, 5, 6, 7, 5, 6]])


class StopAt(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


@pytest.fixture
def counted(tiny_model):
    """The tiny model with a forward counter: no error case may run the model."""
    calls = []
    handle = tiny_model.register_forward_pre_hook(lambda *a, **k: calls.append(1))
    yield tiny_model, calls
    handle.remove()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(input_ids=torch.zeros((1, 0), dtype=torch.long)), "The prompt is empty"),
        (dict(input_ids=IDS.repeat(2, 1), streamer=object()), "Streamers take one sequence"),
        (dict(input_ids=IDS.repeat(2, 1), logits_processor=[ClassifierFreeGuidanceLogitsProcessor(1.5)]),
         "keeps state across the whole batch"),
        (dict(num_beams=3), r"Beam search \(num_beams=3\) cannot be combined"),
        (dict(generation_config=GenerationConfig(num_beams=2, max_new_tokens=5)), "Beam search"),
        (dict(num_return_sequences=2, num_beams=2), "Beam search"),
        (dict(prompt_lookup_num_tokens=10), "replaces transformers' assisted decoding"),
        (dict(input_ids=torch.zeros((1, 512), dtype=torch.long)), "at or beyond the model's maximum length of 512"),
        (dict(return_dict_in_generate=True, output_attentions=True), "output_attentions/output_hidden_states"),
        (dict(custom_generate=lambda *a, **k: None), "cannot be combined with another custom_generate"),
        (dict(stop_strings=["end"]), "stop_strings need the model's tokenizer"),
        (dict(input_ids=IDS.repeat(2, 1), eos_token_id=None, stopping_criteria=StoppingCriteriaList([StopAt(5)])),
         "plain generate\\(\\) keeps writing tokens into the rows they end"),
    ],
)
def test_unsupported_requests(counted, kwargs, message):
    model, calls = counted
    kwargs = {"input_ids": IDS, "max_new_tokens": 5, **kwargs}
    with pytest.raises(UnsupportedGenerationError, match=message):
        model.generate(ngram_speculator=NgramSpeculator(), **kwargs)
    assert calls == []


def test_wrong_speculator_type(counted):
    model, calls = counted
    with pytest.raises(TypeError, match="must be an ngramspec.NgramSpeculator"):
        model.generate(IDS, ngram_speculator="fast please", max_new_tokens=5)
    assert calls == []


def test_filled_cache_is_rejected(counted):
    model, calls = counted
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(IDS, cache=cache)
    calls.clear()
    with pytest.raises(UnsupportedGenerationError, match="starts from an empty KV cache"):
        model.generate(IDS, cache=cache, ngram_speculator=NgramSpeculator(), max_new_tokens=5)
    assert calls == []


def test_custom_generate_without_speculator(counted):
    model, calls = counted
    with pytest.raises(UnsupportedGenerationError, match="needs ngram_speculator"):
        model.generate(IDS, custom_generate=ngramspec.ngram_generate, max_new_tokens=5)
    assert calls == []


def test_a_model_that_generates_no_text_is_rejected():
    from transformers import BertConfig, BertModel, WhisperConfig, WhisperForConditionalGeneration

    bert = BertModel(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32))
    with pytest.raises(UnsupportedGenerationError, match="needs a model that generates text"):
        ngramspec.hf.checks.check_request(bert, IDS)
    # An encoder-decoder is served (tests/test_seq2seq.py) where its encoder reads token ids.
    whisper = WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=16))
    with pytest.raises(UnsupportedGenerationError, match="whose encoder reads input_features, not token ids"):
        ngramspec.hf.checks.check_request(whisper, IDS)

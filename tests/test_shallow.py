"""The target run through a subset of its own layers (ngramspec/hf/shallow.py): what a
self-speculative drafter and `python -m eval selfspec` build on."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from ngramspec.hf.shallow import crop_layers, decoder_layers, prefix_layers, running_layers, skip_middle


def four_layer_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).to(torch.float64).eval()


def test_layer_sets():
    assert prefix_layers(3) == (0, 1, 2)
    assert skip_middle(10, 2, 2) == (0, 1, 8, 9)
    assert skip_middle(10, 2, 2, keep_every=2) == (0, 1, 2, 4, 6, 8, 9)


@torch.no_grad()
def test_prefix_logits_are_the_early_exit_of_the_full_forward():
    """First k layers, final norm, head == lm_head(norm(hidden_states[k])) of the full forward."""
    model = four_layer_llama()
    ids = torch.tensor([[3, 7, 9, 11, 3, 7]])
    full = model(ids, output_hidden_states=True)
    for k in (1, 2, 3):
        with running_layers(model, prefix_layers(k)):
            shallow = model(ids).logits
        early = model.lm_head(model.model.norm(full.hidden_states[k]))
        torch.testing.assert_close(shallow, early)
    assert len(decoder_layers(model)) == 4  # restored after each block
    with running_layers(model, range(4)):
        torch.testing.assert_close(model(ids).logits, full.logits)


@torch.no_grad()
def test_skip_set_changes_the_logits():
    model = four_layer_llama()
    ids = torch.tensor([[3, 7, 9, 11]])
    with running_layers(model, (0, 3)):
        skipped = model(ids).logits
    assert not torch.allclose(skipped, model(ids).logits)


@torch.no_grad()
def test_shallow_step_on_the_shared_cache_is_undone_by_crop_layers():
    """A shallow forward writes only its layers' entries; cropping those leaves the cache such
    that the next full step gives the same logits as without the shallow step."""
    model = four_layer_llama()
    prompt, nxt = torch.tensor([[3, 7, 9, 11, 3]]), torch.tensor([[7]])
    reference = DynamicCache(config=model.config)
    model(prompt, cache=reference)
    expected = model(nxt, cache=reference).logits

    cache = DynamicCache(config=model.config)
    model(prompt, cache=cache)
    kept = (0, 1, 3)
    with running_layers(model, kept):
        model(torch.tensor([[7, 9]]), cache=cache)
    lengths = [layer.get_seq_length() for layer in cache.layers]
    assert lengths == [7, 7, 5, 7]
    crop_layers(cache, kept, 2)
    assert [layer.get_seq_length() for layer in cache.layers] == [5] * 4
    torch.testing.assert_close(model(nxt, cache=cache).logits, expected)


def test_bad_layer_sets_are_refused():
    model = four_layer_llama()
    for kept in ((), (2, 1), (0, 4)):
        with pytest.raises(ValueError), running_layers(model, kept):
            pass

"""Encoder-decoder models (T5Gemma 2, Florence-2, BART, T5, Pegasus, ...): what the loop needs
beyond a causal LM's request.

generate() runs the encoder once and hands the loop the decoder's start tokens (B, 1) and the
encoder's outputs; the loop then decodes as for a causal LM, feeding the decoder. What changes:

* the drafter's text is the row's source (the encoder's input ids, without padding) followed
  by its decoder tokens, so a summary or an edit copies from the document it rewrites;
* rows decode one at a time, each with its slice of the encoder outputs and mask and a cache
  of its own (the decoder has no padding, so a row alone never needs a decoder mask);
* only the decoder's self-attention cache (dynamic or static) is rolled back: the
  cross-attention cache holds the encoder's keys and values, the same for every step.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from .checks import fail


class EncoderInputs:
    """One encoder-decoder request's encoder side, per row: ``model_kwargs`` as generate()
    prepared them (``encoder_outputs``, the encoder's ``attention_mask`` or None),
    ``source_ids`` (B, S) the encoder's input ids (None: drafts come from the output alone)."""

    def __init__(self, model, model_kwargs: dict, cache, source_ids):
        decoder_cache = getattr(cache, "self_attention_cache", None)
        if not isinstance(cache, EncoderDecoderCache) or type(decoder_cache) not in (DynamicCache, StaticCache):
            fail(f"{type(model).__name__} (model type {getattr(model.config, 'model_type', '?')!r}) decodes here with "
                 f"a {type(decoder_cache or cache).__name__} decoder cache; ngram_speculator rolls back an "
                 "encoder-decoder's dynamic or static cache. Use one of those (no cache_implementation, or 'static'), "
                 "or generate without ngram_speculator.")
        self.config = model.config.get_text_config(decoder=True)
        self.cache = cache  # the kind each row's own cache copies
        self.outputs = model_kwargs["encoder_outputs"]
        self.mask = model_kwargs.get("attention_mask")  # (B, S) or None: no padding
        self.source_ids = source_ids if torch.is_tensor(source_ids) and source_ids.dim() == 2 else None

    def row(self, b: int, batch: int) -> dict:
        """Row b's encoder inputs, as the decoder's forward takes them (as given for a batch of one)."""
        if batch == 1:
            return {"encoder_outputs": self.outputs, "attention_mask": self.mask}
        outputs = type(self.outputs)(**{name: _row(value, b) for name, value in self.outputs.items()})
        return {"encoder_outputs": outputs, "attention_mask": None if self.mask is None else self.mask[b : b + 1]}

    def source(self, b: int) -> torch.Tensor:
        """Row b's source tokens without padding (S_b,), the start of its drafter's text."""
        if self.source_ids is None:
            return torch.zeros(0, dtype=torch.long)
        row = self.source_ids[b]
        return row if self.mask is None else row[self.mask[b].bool().to(row.device)]

    def new_cache(self) -> EncoderDecoderCache:
        """An empty cache for one row, of the request's kind and sizes (the cross-attention part is
        filled by its first forward)."""
        return EncoderDecoderCache(*(StaticCache(config=self.config, max_cache_len=part.layers[0].max_cache_len)
                                     if isinstance(part, StaticCache) else DynamicCache(config=self.config)
                                     for part in (self.cache.self_attention_cache, self.cache.cross_attention_cache)))


def _row(value, b: int):
    if torch.is_tensor(value):
        return value[b : b + 1]
    if isinstance(value, tuple):  # per-layer hidden states or attentions
        return tuple(_row(v, b) for v in value)
    return value

"""Self-speculation's building block: the target model run through a subset of its own decoder
layers (the first k, or all but a skipped middle set), sharing its weights and its KV cache.

A shallow forward writes cache entries only in the layers it runs; each keeps its layer index
(``self_attn.layer_idx``), so its keys and values land in that layer's slot of the shared cache.
The caller crops them afterwards with :func:`crop_layers` (transformers' ``cache.crop(-m)`` would
drop m entries from every layer, the untouched ones too), so the full forward that verifies the
drafts sees exactly the cache it would have seen.

Layers are swapped by replacing the decoder's ``layers`` ModuleList for the duration of a
``with`` block: the decoder's forward loops over that list and applies the final norm and, for a
causal LM, the head after it, so the shallow logits are ``lm_head(norm(h_k))``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder's layer list (``model.model.layers`` for Llama-like models)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layer list to run shallowly.")
    return layers


def prefix_layers(depth: int) -> tuple[int, ...]:
    """The first ``depth`` layers (a LayerSkip-style early exit)."""
    return tuple(range(depth))


def skip_middle(num_layers: int, keep_first: int, keep_last: int, keep_every: int = 0) -> tuple[int, ...]:
    """A SWIFT-style layer-skip set: the first ``keep_first`` and last ``keep_last`` layers, and
    of the middle ones every ``keep_every``-th (0: none of them; 2: every other one skipped)."""
    middle = range(keep_first, num_layers - keep_last)
    kept_middle = tuple(i for n, i in enumerate(middle) if keep_every and n % keep_every == 0)
    return tuple(range(keep_first)) + kept_middle + tuple(range(num_layers - keep_last, num_layers))


@contextmanager
def running_layers(model, kept: Sequence[int]) -> Iterator[None]:
    """Within the block, ``model``'s forward runs only decoder layers ``kept`` (in order)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    full = decoder_layers(model)
    kept = tuple(kept)
    if not kept or list(kept) != sorted(set(kept)) or kept[-1] >= len(full):
        raise ValueError(f"kept layers must be increasing indices below {len(full)}; got {kept}")
    decoder.layers = torch.nn.ModuleList([full[i] for i in kept])
    try:
        yield
    finally:
        decoder.layers = full


def crop_layers(cache, kept: Sequence[int], tokens: int) -> None:
    """Drop the last ``tokens`` entries of cache layers ``kept`` only (the ones a shallow
    forward over that many tokens wrote)."""
    if tokens > 0:
        for i in kept:
            cache.layers[i].crop(-tokens)

"""A self-test of a model's cache under the loop's own steps, once per model, before the first
request: what makes "any model transformers loads" hold for architectures nobody listed.

The loop relies on three things the model's code must do: attend over the cache (so a forward
sees only the new tokens), take explicit positions, and roll back to any prefix of its last
forward with one crop. The probe runs those steps on six tokens of the request's own prompt with
a fresh cache of the request's kind, dynamic or static (prefill 2, verify a block of 3, crop 1,
verify 2 more), and compares every row's logits, and every recurrent layer's states, with plain
decoding's (prefill 2, then one token per forward). A model that fails, or raises, is refused
with its reason before any forward of the request.
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from .checks import UnsupportedGenerationError, fail

# model -> {(static cache?, explicit positions?): refusal or None}
_VERDICTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_model_steps(model, input_ids: torch.Tensor, cache, explicit: bool, encoder: dict | None = None) -> None:
    """Refuse ``model`` (UnsupportedGenerationError) when the loop's steps do not reproduce a plain
    forward on it, given position ids or not (``explicit``, as generate() gives them); runs once
    per model object and cache kind (later calls read the verdict). ``encoder``: an
    encoder-decoder's encoder inputs for one row (the steps then run its decoder)."""
    decoder_cache = getattr(cache, "self_attention_cache", cache)  # (an encoder-decoder's: its decoder's part)
    static = any(hasattr(layer, "max_cache_len") for layer in getattr(decoder_cache, "layers", ()))
    verdicts = _VERDICTS.setdefault(model, {})
    if (static, explicit) not in verdicts:
        verdicts[static, explicit] = _probe(model, input_ids[0], static, explicit, encoder)
    if verdicts[static, explicit] is not None:
        fail(verdicts[static, explicit])


def _probe(model, prompt: torch.Tensor, static: bool, explicit: bool, encoder: dict | None) -> str | None:
    from .target import HFTarget

    tokens = prompt.repeat(6 // len(prompt) + 1)[:6][None]  # (1, 6): the prompt's own ids, no special ones
    positions = torch.arange(6, device=tokens.device)[None]
    try:
        with torch.no_grad():
            config = model.config.get_text_config(decoder=True)
            plain_cache = _with_encoder(DynamicCache(config=config), config, encoder)
            reference = _plain_steps(model, tokens, positions if explicit else None, plain_cache, encoder)
            cache = StaticCache(config=config, max_cache_len=8) if static else DynamicCache(config=config)
            target = HFTarget(model, _with_encoder(cache, config, encoder), explicit, encoder)
            target.forward(tokens[:, :2], positions[:, :2], None, 1)  # prefill: the cache holds 0..1
            block = target.forward(tokens[:, 2:5], positions[:, 2:5], None, 3)  # [last, draft 2] -> 3, 4, 5
            target.crop(1)  # token 4 rejected: the cache holds 0..3
            after = target.forward(tokens[:, 4:6], positions[:, 4:6], None, 2)  # -> 5, 6
    except UnsupportedGenerationError as err:  # a rule of the loop's own: its message says it all
        return str(err)
    except Exception as err:  # noqa: BLE001 - any failure of the steps is the verdict
        return _refusal(model, f"its forward failed under the loop's steps ({type(err).__name__}: "
                               f"{' '.join(str(err).split())[:200]})")
    got = torch.cat([block[:, :2], after], dim=1)  # predictions at positions 2, 3, 4, 5
    error = _distance(got, reference)
    if not error <= _tolerance(model):
        return _refusal(model, f"a forward over new tokens on top of its cache, rolled back by one crop, gives "
                               f"logits {error:.2g} (relative) away from one plain forward over the same tokens")
    state_error = _state_distance(target.cache, plain_cache)
    if not state_error <= _tolerance(model):
        return _refusal(model, f"after a forward over new tokens on top of its cache, rolled back by one crop, its "
                               f"recurrent states are {state_error:.2g} (relative) away from plain decoding's")
    return None


def _state_distance(cache, plain_cache) -> float:
    """The largest relative distance between the two caches' recurrent and (live) convolution
    states: the logits of a random model can barely depend on a state a rollback got wrong."""
    worst = 0.0
    for ours, theirs in zip(getattr(cache, "self_attention_cache", cache).layers,
                            getattr(plain_cache, "self_attention_cache", plain_cache).layers):
        for name in ("recurrent_states", "conv_states"):
            for i, want in (getattr(theirs, name, None) or {}).items():
                got = getattr(ours, name, {}).get(i)
                if torch.is_tensor(want) and torch.is_tensor(got):
                    live = got[..., -want.shape[-1]:] if name == "conv_states" else got
                    worst = max(worst, _distance(live.float(), want.float()))
    return worst


def _with_encoder(cache, config, encoder: dict | None):
    """An encoder-decoder's cache: the decoder's self-attention ``cache`` and an empty
    cross-attention one (filled by the first forward)."""
    return cache if encoder is None else EncoderDecoderCache(cache, DynamicCache(config=config))


def _plain_steps(model, tokens, positions, cache, encoder: dict | None) -> torch.Tensor:
    """Plain decoding's logits after tokens 2, 3, 4 and 5 (1, 4, V): a prefill of two tokens,
    then one token per forward (a prefix-LM such as PaliGemma sees its prompt whole only here)."""
    from .target import model_forward

    logits = []
    for start, end in ((0, 2), (2, 3), (3, 4), (4, 5), (5, 6)):
        given = None if positions is None else positions[:, start:end]
        out = model_forward(model, tokens[:, start:end], cache, 1, given, None, encoder)
        logits.append(out.logits[:, -1:].float())
    return torch.cat(logits[1:], dim=1)


def _distance(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / (want.abs().max().item() + 1e-6)


def _tolerance(model) -> float:
    return 1e-3 if model.dtype in (torch.float32, torch.float64) else 3e-2


def _refusal(model, reason: str) -> str:
    return (f"{type(model).__name__} (model type {getattr(model.config, 'model_type', '?')!r}) does not decode "
            f"speculatively as the loop needs: {reason}. Generate without ngram_speculator.")

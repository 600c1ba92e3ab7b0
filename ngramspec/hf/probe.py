"""A self-test of a model's cache under the loop's own steps, once per model, before the first
request: what makes "any model transformers loads" hold for architectures nobody listed.

The loop relies on three things the model's code must do: attend over the cache (so a forward
sees only the new tokens), take explicit positions, and roll back to any prefix of its last
forward with one crop. The probe runs those steps on six tokens of the request's own prompt with
a fresh dynamic cache (prefill 3, verify a block of 3, crop 1, verify 2 more) and compares every
row's logits with one plain forward over the six tokens. A model that fails, or raises, is
refused with its reason before any forward of the request; nothing it would produce is trusted.
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache

from .checks import UnsupportedGenerationError, fail

_VERDICTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> None (passed) or the reason


def check_model_steps(model, input_ids: torch.Tensor) -> None:
    """Refuse ``model`` (UnsupportedGenerationError) when the loop's steps do not reproduce a plain
    forward on it; runs once per model object (later calls read the verdict)."""
    if model not in _VERDICTS:
        _VERDICTS[model] = _probe(model, input_ids[0])
    if _VERDICTS[model] is not None:
        fail(_VERDICTS[model])


def _probe(model, prompt: torch.Tensor) -> str | None:
    from .target import HFTarget

    tokens = prompt.repeat(6 // len(prompt) + 1)[:6][None]  # (1, 6): the prompt's own ids, no special ones
    device = tokens.device
    positions = torch.arange(6, device=device)[None]
    try:
        with torch.no_grad():
            reference = model(input_ids=tokens, position_ids=positions, use_cache=False).logits.float()  # (1, 6, V)
            target = HFTarget(model, DynamicCache(config=model.config.get_text_config(decoder=True)))
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
    want = reference[:, 2:6]
    scale = want.abs().max().item() + 1e-6
    tolerance = 1e-3 if want.dtype == torch.float32 and model.dtype in (torch.float32, torch.float64) else 3e-2
    error = (got - want).abs().max().item() / scale
    if not error <= tolerance:
        return _refusal(model, f"a forward over new tokens on top of its cache, rolled back by one crop, gives "
                               f"logits {error:.2g} (relative) away from one plain forward over the same tokens")
    return None


def _refusal(model, reason: str) -> str:
    return (f"{type(model).__name__} (model type {getattr(model.config, 'model_type', '?')!r}) does not decode "
            f"speculatively as the loop needs: {reason}. Generate without ngram_speculator.")

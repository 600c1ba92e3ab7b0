"""Everything that touches transformers: the ``generate()`` hook, caches, processors, stops.

Two ways in, one implementation:

* ``model.generate(ids, ngram_speculator=spec, ...)``: ``import ngramspec`` wraps
  ``GenerationMixin.generate`` once. Calls without ``ngram_speculator`` go to the original
  untouched; calls with it are routed through transformers' official extension hook below.
* ``model.generate(ids, custom_generate=ngramspec.ngram_generate, ngram_speculator=spec)``:
  the hook itself. generate() does all of its preparation (config merge, special tokens,
  attention mask, a fresh DynamicCache, logits processors, stopping criteria) and then calls
  :func:`ngram_generate`, which runs the speculative loop of ``decode.py``.

generate() does not hand its ``streamer`` to a ``custom_generate`` callable, so the wrapper
passes it on as ``ngram_streamer``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from transformers import GenerationMixin
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from .decode import StopRule, speculative_greedy
from .speculator import NgramSpeculator

# model_kwargs that generate() prepares for every causal LM; anything else (images, embeddings,
# encoder outputs, ...) is a modality or mode the speculative loop does not handle.
_KNOWN_MODEL_KWARGS = {"attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep"}


_ASSISTED_CONFLICT = (
    "ngram_speculator replaces transformers' assisted decoding: do not also pass "
    "prompt_lookup_num_tokens or assistant_model."
)


class UnsupportedGenerationError(ValueError):
    """A generate() request that speculative decoding cannot serve exactly; says what to do."""


def _fail(message: str):
    raise UnsupportedGenerationError(message)


def check_request(model, input_ids=None, generation_config=None, model_kwargs=None, speculator=None) -> None:
    """Raise a clear error, before any forward pass, for requests the speculator cannot serve.
    Each check runs on whatever is known at the call site (the wrapper knows the raw inputs,
    the hook also knows the merged generation config and the prepared model kwargs)."""
    if speculator is not None and not isinstance(speculator, NgramSpeculator):
        raise TypeError(
            f"ngram_speculator must be an ngramspec.NgramSpeculator, got {type(speculator).__name__}. "
            "Create one with ngramspec.NgramSpeculator()."
        )
    config = model.config
    if getattr(config, "is_encoder_decoder", False) or not model.can_generate():
        _fail(
            f"ngram_speculator needs a decoder-only causal LM; {type(model).__name__} is not one. "
            "Load the model with AutoModelForCausalLM, or generate without ngram_speculator."
        )
    if generation_config is not None:
        gc = generation_config
        if gc.num_beams is not None and gc.num_beams > 1:
            _fail(
                f"Beam search (num_beams={gc.num_beams}) cannot be combined with ngram_speculator; "
                "use num_beams=1, or drop ngram_speculator for beam search."
            )
        if gc.num_return_sequences is not None and gc.num_return_sequences > 1:
            _fail(
                f"num_return_sequences={gc.num_return_sequences} is not supported with ngram_speculator "
                "yet (it decodes one sequence per call); call generate() once per sample."
            )
        if gc.prompt_lookup_num_tokens:
            _fail(_ASSISTED_CONFLICT)
        if gc.return_dict_in_generate and (gc.output_attentions or gc.output_hidden_states):
            _fail(
                "output_attentions/output_hidden_states are not returned by ngram_speculator; "
                "generate without them (scores and logits are supported)."
            )
    if input_ids is not None:
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2:
            _fail("ngram_speculator needs input_ids as a 2-D tensor of shape (1, prompt_length).")
        if input_ids.shape[1] == 0:
            _fail("The prompt is empty: give at least one token (e.g. the BOS token) in input_ids.")
        if input_ids.shape[0] != 1:
            _fail(
                f"ngram_speculator decodes one sequence at a time, got a batch of {input_ids.shape[0]}. "
                "Call generate() once per row, or generate without ngram_speculator."
            )
        limit = getattr(config, "max_position_embeddings", None)
        if limit is not None and input_ids.shape[1] >= limit:
            _fail(
                f"The prompt has {input_ids.shape[1]} tokens, at or beyond the model's maximum "
                f"length of {limit}; shorten the prompt (or split the document into chunks)."
            )
    if model_kwargs is not None:
        extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _KNOWN_MODEL_KWARGS)
        if extra:
            _fail(
                f"ngram_speculator handles text-only input_ids; unsupported generate() inputs: {extra}. "
                "Generate without ngram_speculator for these."
            )
        cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
        if cache is not None and cache.get_seq_length() > 0:
            _fail(
                "ngram_speculator starts from an empty KV cache; do not pass a filled "
                "past_key_values/cache (pass the whole prompt instead)."
            )


def _stop_rule(stopping_criteria: StoppingCriteriaList) -> StopRule:
    """Split generate()'s stopping criteria into the loop's fast checks and a generic rest."""
    max_length, eos, rest = None, set(), StoppingCriteriaList()
    for criterion in stopping_criteria:
        if isinstance(criterion, MaxLengthCriteria):
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif isinstance(criterion, EosTokenCriteria):
            eos.update(int(t) for t in criterion.eos_token_id.flatten().tolist())
        else:
            rest.append(criterion)
    if max_length is None:  # generate() always sets one; keep the loop finite regardless
        max_length = 2**31 - 1
    extra = (lambda prefix: bool(rest(prefix, None).any())) if len(rest) else None
    return StopRule(max_length=max_length, eos_token_ids=frozenset(eos), extra=extra)


def ngram_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    ngram_speculator: NgramSpeculator | None = None,
    ngram_streamer=None,
    **model_kwargs,
):
    """transformers ``custom_generate`` callable: speculative greedy decoding or sampling of
    one sequence.

    Use through ``model.generate(ids, ngram_speculator=spec)``, or explicitly with
    ``model.generate(ids, custom_generate=ngram_generate, ngram_speculator=spec)``.
    """
    if ngram_speculator is None:
        _fail("custom_generate=ngram_generate needs ngram_speculator=NgramSpeculator(...).")
    check_request(model, input_ids, generation_config, model_kwargs, ngram_speculator)
    if synced_gpus:
        _fail("synced_gpus (DeepSpeed ZeRO-3 / FSDP) is not supported with ngram_speculator.")

    cache = model_kwargs.get("cache")
    if cache is None:
        cache = model_kwargs.get("past_key_values")
    if cache is None:
        _fail("generate() prepared no KV cache; ngram_speculator needs use_cache=True.")
    attention_mask = model_kwargs.get("attention_mask")  # None: no padding (generate drops all-ones)
    prompt_len = input_ids.shape[1]
    if attention_mask is not None:
        # New tokens sit right after the prompt's last real token: position = real tokens so far.
        real_in_prompt = int(attention_mask.sum())
        mask = torch.ones((1, prompt_len + 4096), dtype=attention_mask.dtype, device=input_ids.device)
        mask[:, :prompt_len] = attention_mask

    def forward(ids: torch.Tensor, start: int, keep: int) -> torch.Tensor:
        # ids: (1, q) at stream positions start..start+q-1; returns float32 logits (keep, V).
        q = ids.shape[1]
        extra = {}
        if start == 0:
            extra["position_ids"] = model_kwargs.get("position_ids")
            extra["attention_mask"] = attention_mask
        elif attention_mask is not None:
            nonlocal mask
            if start + q > mask.shape[1]:
                mask = torch.cat([mask, torch.ones_like(mask)], dim=1)
            extra["attention_mask"] = mask[:, : start + q]
            first = real_in_prompt + (start - prompt_len)
            extra["position_ids"] = torch.arange(first, first + q, device=ids.device).unsqueeze(0)
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep, **extra)
        if start == 0:
            # Sliding-window and linear-attention layers drop old states on update; recording
            # keeps them until the next crop, so rejected draft tokens can be rolled back.
            # (After the prefill, as generate() does: recording during it would hold it all.)
            cache.activate_past_recording()
        return out.logits[0, -keep:].float()

    def crop(m: int) -> None:
        cache.crop(-m)

    session = ngram_speculator.start(input_ids[0], capacity=min(generation_config.max_length, prompt_len + (1 << 16)))
    optimize = getattr(model, "_optimize_model_for_decode", None)
    with optimize() if optimize is not None else contextlib.nullcontext():
        result = speculative_greedy(
            input_ids,
            session,
            forward,
            crop,
            _stop_rule(stopping_criteria),
            process=logits_processor if len(logits_processor) else None,
            streamer=ngram_streamer,
            keep_scores=bool(generation_config.return_dict_in_generate and generation_config.output_scores),
            keep_logits=bool(generation_config.return_dict_in_generate and generation_config.output_logits),
            sample=bool(generation_config.do_sample),
        )
    ngram_speculator.last_stats = result.stats
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=result.sequence,
            scores=tuple(result.scores) if generation_config.output_scores else None,
            logits=tuple(result.logits) if generation_config.output_logits else None,
            cache=cache,
        )
    return result.sequence


def _route_stop_strings(model, kwargs: dict) -> None:
    """generate() drops its ``tokenizer`` argument before calling a ``custom_generate``
    callable, and then refuses stop strings for lack of a tokenizer. So, when the speculator
    is used, build the stop-string criterion here and hand it over as a stopping criterion."""
    tokenizer = kwargs.pop("tokenizer", None)
    if "stop_strings" in kwargs:
        stop_strings = kwargs["stop_strings"]
    else:
        stop_strings = (kwargs.get("generation_config") or model.generation_config).stop_strings
    if not stop_strings:
        return
    if tokenizer is None:
        _fail("stop_strings need the model's tokenizer: pass tokenizer=... to generate().")
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    kwargs["stopping_criteria"] = criteria
    kwargs["stop_strings"] = None  # handled by the criterion above


def _wrap_generate(original):
    positional = list(inspect.signature(original).parameters)[1:]  # generate's names after self

    @functools.wraps(original)
    def generate(self, *args, ngram_speculator=None, **kwargs):
        custom = kwargs.get("custom_generate")
        if ngram_speculator is None and custom is not ngram_generate:
            return original(self, *args, **kwargs)  # untouched: plain transformers behaviour
        kwargs.update(zip(positional, args))
        inputs = kwargs.get("inputs", kwargs.get("input_ids"))
        check_request(self, inputs, speculator=ngram_speculator)
        if custom is not None and custom is not ngram_generate:
            _fail("ngram_speculator cannot be combined with another custom_generate.")
        if kwargs.get("prompt_lookup_num_tokens") or kwargs.get("assistant_model") is not None:
            _fail(_ASSISTED_CONFLICT)
        _route_stop_strings(self, kwargs)
        kwargs["custom_generate"] = ngram_generate
        kwargs["ngram_streamer"] = kwargs.pop("streamer", None)
        return original(self, ngram_speculator=ngram_speculator, **kwargs)

    generate._ngramspec_original = original
    return generate


def install() -> None:
    """Let ``model.generate`` accept ``ngram_speculator=`` (idempotent; done on import)."""
    if not hasattr(GenerationMixin.generate, "_ngramspec_original"):
        GenerationMixin.generate = _wrap_generate(GenerationMixin.generate)


def uninstall() -> None:
    """Restore transformers' own ``generate``."""
    original = getattr(GenerationMixin.generate, "_ngramspec_original", None)
    if original is not None:
        GenerationMixin.generate = original

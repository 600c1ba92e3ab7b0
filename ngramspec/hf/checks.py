"""Requests ngram_speculator cannot serve exactly, refused before any forward pass with an
error that says what to do instead."""

from __future__ import annotations

import inspect
import warnings

import torch
from transformers import GenerationMixin

from ..draft.speculator import NgramSpeculator

# model_kwargs that generate() prepares for every causal LM; anything else (images, embeddings,
# encoder outputs, ...) is a modality or mode the speculative loop does not handle.
_KNOWN_MODEL_KWARGS = {"attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep"}


ASSISTED_CONFLICT = (
    "ngram_speculator replaces transformers' assisted decoding: do not also pass "
    "prompt_lookup_num_tokens or assistant_model."
)


class UnsupportedGenerationError(ValueError):
    """A generate() request that speculative decoding cannot serve exactly; says what to do."""


def fail(message: str):
    raise UnsupportedGenerationError(message)


class InexactPrecisionWarning(UserWarning):
    """Greedy output may part from plain greedy at near-ties: a 16-bit model whose attention
    kernel rounds a forward over several tokens differently from one-token forwards."""


# Measured with the default model on a 2-core CPU, greedy, 64 new tokens on the first 3 prompts of
# six shared sets (python -m eval precision, eval/results/precision): in bfloat16 ngramspec's output
# parted from plain greedy at a near-tie on 7 of 18 prompts with sdpa attention (prompt lookup on 9)
# and on 1 of 18 with eager attention (prompt lookup on 2), whose matmuls and softmax mostly give a
# row the same result whatever the number of rows; in float32 on none of 30.
_ROW_STABLE_ATTENTION = ("eager",)


def warn_if_inexact(model, generation_config) -> None:
    """Warn (once per model) that greedy output may part from plain greedy at near-ties because
    of rounding: 16-bit weights, whose kernels may round a forward over several tokens
    differently from one-token forwards. The warning says how to get token-identical output;
    speculation itself goes on (it is not switched off silently)."""
    dtype = getattr(model, "dtype", torch.float32)
    if (dtype not in (torch.bfloat16, torch.float16) or (generation_config is not None and generation_config.do_sample)
            or getattr(model, "_ngramspec_precision_warned", False)):
        return
    model._ngramspec_precision_warned = True
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    name = str(dtype).removeprefix("torch.")
    if attention in _ROW_STABLE_ATTENTION:
        why = ("even with eager attention a kernel may round a forward over several tokens differently from plain "
               "decoding's one-token forwards (with the default model on CPU in bfloat16, 1 of 18 outputs of 64 "
               "tokens parted). For token-identical output load the model in float32.")
    else:
        why = (f"its {attention} attention kernel rounds a forward over several tokens differently from plain "
               "decoding's one-token forwards (with the default model on CPU in bfloat16, 7 of 18 outputs of 64 "
               "tokens parted; with eager attention 1 did). For output identical but at rare near-ties load the "
               "model with attn_implementation='eager'; for token-identical output, in float32.")
    warnings.warn(f"ngram_speculator: {type(model).__name__} runs in {name}, so greedy output can part from plain "
                  f"greedy where two tokens' logits are within rounding: {why}", InexactPrecisionWarning, stacklevel=2)


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
    if not model.can_generate():
        fail(
            f"ngram_speculator needs a model that generates text; {type(model).__name__} does not. Load the model "
            "with AutoModelForCausalLM (or AutoModelForSeq2SeqLM), or generate without ngram_speculator."
        )
    if getattr(config, "is_encoder_decoder", False) and getattr(model, "main_input_name", "input_ids") != "input_ids":
        fail(
            f"ngram_speculator drafts from text: {type(model).__name__} (model type "
            f"{getattr(config, 'model_type', '?')!r}) is an encoder-decoder whose encoder reads "
            f"{model.main_input_name}, not token ids. Generate without ngram_speculator."
        )
    _check_cache_support(model)
    if generation_config is not None:
        gc = generation_config
        if gc.num_beams is not None and gc.num_beams > 1:
            fail(
                f"Beam search (num_beams={gc.num_beams}) cannot be combined with ngram_speculator; "
                "use num_beams=1, or drop ngram_speculator for beam search."
            )
        if gc.prompt_lookup_num_tokens:
            fail(ASSISTED_CONFLICT)
        if gc.return_dict_in_generate and (gc.output_attentions or gc.output_hidden_states):
            fail(
                "output_attentions/output_hidden_states are not returned by ngram_speculator; "
                "generate without them (scores and logits are supported)."
            )
    if input_ids is not None:
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2:
            fail("ngram_speculator needs input_ids as a 2-D tensor of shape (batch, prompt_length).")
        if input_ids.shape[1] == 0:
            fail("The prompt is empty: give at least one token (e.g. the BOS token) in input_ids.")
        limit = getattr(config, "max_position_embeddings", None)
        if limit is not None and input_ids.shape[1] >= limit:
            fail(
                f"The prompt has {input_ids.shape[1]} tokens, at or beyond the model's maximum "
                f"length of {limit}; shorten the prompt (or split the document into chunks)."
            )
    if model_kwargs is not None:
        # (generate() prepares an empty mm_encoder_outputs {} for a text-only prompt)
        known = _KNOWN_MODEL_KWARGS | ({"encoder_outputs"} if getattr(config, "is_encoder_decoder", False) else set())
        extra = sorted(k for k, v in model_kwargs.items()
                       if v is not None and not (isinstance(v, dict) and not v) and k not in known)
        if extra:
            fail(
                f"ngram_speculator handles text-only input_ids; unsupported generate() inputs: {extra}. "
                "Generate without ngram_speculator for these."
            )
        cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
        check_cache(model, cache)
        if cache is not None and cache.get_seq_length() > 0:
            fail(
                "ngram_speculator starts from an empty KV cache; do not pass a filled "
                "past_key_values/cache (pass the whole prompt instead)."
            )


def _check_cache_support(model) -> None:
    """The loop verifies a draft on top of the model's cache and rolls rejected tokens back:
    a model that keeps no cache would see only the new tokens, and one that keeps its own
    state object (RWKV, xLSTM, Reformer, XLNet, MiniMax) cannot be rolled back by the loop."""
    model_type = getattr(model.config, "model_type", "?")
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        fail(
            f"{type(model).__name__} (model type {model_type!r}) keeps its recurrent state in its own object, which "
            "ngram_speculator cannot roll back to the accepted prefix. Generate without ngram_speculator (a model "
            "with a transformers Cache, e.g. Mamba, Mamba2 or FalconMamba, is supported)."
        )
    forward = inspect.signature(model.forward).parameters
    if "cache" not in forward and "past_key_values" not in forward:
        fail(
            f"{type(model).__name__} (model type {model_type!r}) keeps no KV cache, so a draft cannot be verified "
            "on top of the context (each forward would see only the new tokens). Generate without ngram_speculator."
        )
    _check_feeds_new_tokens(model, model_type)


def _decode_inputs(model) -> dict | None:
    """What the model's own ``prepare_inputs_for_generation`` feeds a decode step of one new token
    after two (positions given, as generate() gives them); None where it needs a real cache (or
    is transformers' own, which feeds the new token and passes positions through)."""
    if type(model).prepare_inputs_for_generation is GenerationMixin.prepare_inputs_for_generation:
        return None
    ids = torch.zeros((1, 2), dtype=torch.long, device=model.device)
    try:
        prepared = model.prepare_inputs_for_generation(
            ids, next_sequence_length=1, is_first_iteration=False, use_cache=True,
            position_ids=torch.arange(2, device=model.device)[None], attention_mask=torch.ones_like(ids))
    except Exception:  # noqa: BLE001 - an override that needs a real cache: transformers' defaults hold
        return None
    return prepared if isinstance(prepared, dict) else None


def passes_positions(model) -> bool:
    """Whether generate() gives the model explicit position ids (0, 1, 2, ... over the real
    tokens). Not when its forward takes none (it counts from its cache, pads included), nor when
    its own inputs drop them (Kosmos-2.5 counts from its padding index): the loop does the same."""
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return False
    prepared = _decode_inputs(model)
    return prepared is None or prepared.get("position_ids") is not None


def _check_feeds_new_tokens(model, model_type: str) -> None:
    """The loop feeds a forward only the tokens the cache lacks. A model whose generate() feeds
    it the whole sequence every step (it slices off the cached part itself: CPM-Ant) says so in
    its ``prepare_inputs_for_generation``; asked for one new token it returns them all."""
    fed = (_decode_inputs(model) or {}).get("input_ids")
    if torch.is_tensor(fed) and fed.shape[-1] > 1:
        fail(
            f"{type(model).__name__} (model type {model_type!r}) is fed the whole sequence at every step (its "
            "forward slices the cached part off itself), so a draft cannot be verified on top of the cache. "
            "Generate without ngram_speculator."
        )


def check_cache(model, cache) -> None:
    """A cache whose rejected draft tokens cannot be rolled back (transformers says so with
    ``is_croppable``: quantized layers, a static sliding window longer than its window, some
    models' own caches) would keep them: refused."""
    readers = [layer for layer in getattr(cache, "layers", ()) if _reads_other_layers(layer)]
    if readers:
        fail(
            f"{type(model).__name__} (model type {getattr(model.config, 'model_type', '?')!r}) shares key/value "
            f"states across layers ({type(readers[0]).__name__} reads another layer's), which speculative "
            "verification cannot roll back layer by layer. Generate without ngram_speculator."
        )
    if cache is not None and not getattr(cache, "is_croppable", True):
        layers = sorted({type(layer).__name__ for layer in getattr(cache, "layers", ()) if not layer.is_croppable})
        fail(
            f"{type(model).__name__} (model type {getattr(model.config, 'model_type', '?')!r}) decodes here with a "
            f"{type(cache).__name__} whose layers {layers or ''} cannot be rolled back to the accepted prefix, which "
            "speculative decoding needs. Use the default dynamic cache (no cache_implementation, or "
            "cache_implementation='dynamic'), or generate without ngram_speculator."
        )


def _reads_other_layers(layer) -> bool:
    """A cache-less placeholder layer that overrides update(): it serves another layer's states."""
    from transformers import cache_utils

    dummy = getattr(cache_utils, "DummyLayer", None)
    return dummy is not None and isinstance(layer, dummy) and type(layer).update is not dummy.update


def check_batch_request(logits_processor, streamer, stopping_criteria=()) -> None:
    """A batch: no streamer, no processor that keeps state across the whole batch, and no stop
    rule that plain decoding would apply without padding the rows it ends."""
    has_eos = any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)
    if not has_eos and any(type(c).__name__ not in _WHOLE_BATCH_STOPS for c in stopping_criteria):
        # generate() pads a finished row only when an EOS criterion exists; otherwise a row that
        # a stop string or a user criterion ended keeps receiving the model's tokens until every
        # row has stopped. The loop drops finished rows, so it cannot give those tokens.
        fail(
            "A batch with stop strings or stopping criteria but no eos_token_id: plain generate() "
            "keeps writing tokens into the rows they end (it pads only when there is an EOS), which "
            "ngram_speculator cannot reproduce. Set generation_config.eos_token_id, or generate one "
            "row at a time."
        )
    if streamer is not None:
        fail(
            "Streamers take one sequence (transformers' TextStreamer raises for batch > 1 too); "
            "stream one prompt at a time, or drop the streamer for a batch."
        )
    for processor in logits_processor:
        name = type(processor).__name__
        if name in _BATCH_STATE_PROCESSORS:
            fail(
                f"{name} keeps state across the whole batch, which ngram_speculator's batched loop "
                "(rows advance by different amounts) cannot provide; call generate() once per row."
            )


# Stopping criteria that end every row at once (so no row is ever ended alone).
_WHOLE_BATCH_STOPS = {"MaxLengthCriteria", "MaxTimeCriteria"}

# Processors that keep per-batch state or mix rows: they cannot be applied row by row.
_BATCH_STATE_PROCESSORS = {
    "SynthIDTextWatermarkLogitsProcessor",
    "ClassifierFreeGuidanceLogitsProcessor",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor",
}

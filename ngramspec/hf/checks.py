"""Requests ngram_speculator cannot serve exactly, refused before any forward pass with an
error that says what to do instead."""

from __future__ import annotations

import inspect

import torch

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
        fail(
            f"ngram_speculator needs a decoder-only causal LM; {type(model).__name__} is not one. "
            "Load the model with AutoModelForCausalLM, or generate without ngram_speculator."
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
        extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _KNOWN_MODEL_KWARGS)
        if extra:
            fail(
                f"ngram_speculator handles text-only input_ids; unsupported generate() inputs: {extra}. "
                "Generate without ngram_speculator for these."
            )
        cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
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

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
import copy
import functools
import inspect
import warnings

import torch
from transformers import DynamicCache, GenerationMixin
from transformers.cache_utils import DynamicLayer
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.logits_process import (
    LogitsProcessorList,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from .batch import speculative_batch, stack_per_index
from .config import CPU_VERIFY_COST
from .decode import StopRule, speculative_greedy, to_device
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
        if gc.prompt_lookup_num_tokens:
            _fail(_ASSISTED_CONFLICT)
        if gc.return_dict_in_generate and (gc.output_attentions or gc.output_hidden_states):
            _fail(
                "output_attentions/output_hidden_states are not returned by ngram_speculator; "
                "generate without them (scores and logits are supported)."
            )
    if input_ids is not None:
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2:
            _fail("ngram_speculator needs input_ids as a 2-D tensor of shape (batch, prompt_length).")
        if input_ids.shape[1] == 0:
            _fail("The prompt is empty: give at least one token (e.g. the BOS token) in input_ids.")
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
    """transformers ``custom_generate`` callable: speculative greedy decoding or sampling.

    Use through ``model.generate(ids, ngram_speculator=spec)``, or explicitly with
    ``model.generate(ids, custom_generate=ngram_generate, ngram_speculator=spec)``.
    A batch (left-padded, with its attention mask; or one prompt expanded by
    ``num_return_sequences``) is verified in one forward per step, each row accepting its own
    number of draft tokens. ``ngram_speculator.last_stats`` is a ``DecodeStats`` for one row,
    or a list of them (one per row) for a batch.
    """
    if ngram_speculator is None:
        _fail("custom_generate=ngram_generate needs ngram_speculator=NgramSpeculator(...).")
    check_request(model, input_ids, generation_config, model_kwargs, ngram_speculator)
    _warn_if_cpu_curve_on_accelerator(model, ngram_speculator)
    if synced_gpus:
        _fail("synced_gpus (DeepSpeed ZeRO-3 / FSDP) is not supported with ngram_speculator.")
    cache = model_kwargs.get("cache")
    if cache is None:
        cache = model_kwargs.get("past_key_values")
    if cache is None:
        _fail("generate() prepared no KV cache; ngram_speculator needs use_cache=True.")
    batch = input_ids.shape[0]
    if batch > 1:
        _check_batch_request(logits_processor, ngram_streamer)

    attention_mask = model_kwargs.get("attention_mask")  # None: no padding (generate drops all-ones)
    positions = model_kwargs.get("position_ids")
    if positions is None:
        positions = _positions_from_mask(input_ids, attention_mask)
    settings = dict(
        stop=_stop_rule(stopping_criteria),
        keep_scores=bool(generation_config.return_dict_in_generate and generation_config.output_scores),
        keep_logits=bool(generation_config.return_dict_in_generate and generation_config.output_logits),
        sample=bool(generation_config.do_sample),
    )
    capacity = min(generation_config.max_length, input_ids.shape[1] + (1 << 16))
    pad = generation_config._pad_token_tensor
    pad_token_id = int(pad) if pad is not None else 0

    optimize = getattr(model, "_optimize_model_for_decode", None)
    with optimize() if optimize is not None else contextlib.nullcontext():
        if batch == 1:
            result = _decode_row(model, input_ids, attention_mask, positions, cache, ngram_speculator, capacity,
                                 streamer=ngram_streamer, process=_processors_for_row(logits_processor, 0), **settings)
            sequences, scores, logits, stats = result.sequence, result.scores, result.logits, result.stats
        elif _shared_cache_ok(cache):
            sessions = [ngram_speculator.start(_real_tokens(input_ids, attention_mask, b), capacity) for b in range(batch)]
            result = speculative_batch(
                input_ids, attention_mask, positions, sessions, *_batch_callables(model, cache),
                pad_token_id=pad_token_id, forward_cost=ngram_speculator.config.forward_cost
                if ngram_speculator.config.payoff_sizing else None,
                process=[_processors_for_row(logits_processor, b) for b in range(batch)], **settings,
            )
            for session in sessions:
                session.finish()
            sequences, scores, logits, stats = result.sequences, result.scores, result.logits, result.stats
            cache = None  # holds masked holes: not a cache plain decoding could continue from
        else:
            # Sliding-window or static caches cannot hold per-row holes: decode row by row,
            # each with its left padding (processors see what plain batched decoding shows).
            rows = [
                _decode_row(model, input_ids[b : b + 1],
                            attention_mask[b : b + 1] if attention_mask is not None else None,
                            positions[b : b + 1], DynamicCache(config=model.config), ngram_speculator, capacity,
                            process=_processors_for_row(logits_processor, b), **settings)
                for b in range(batch)
            ]
            sequences, scores, logits, stats = _join_rows(rows, input_ids.shape[1], pad_token_id, settings)
            cache = None
    ngram_speculator.last_stats = stats
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=sequences,
            scores=tuple(scores) if generation_config.output_scores else None,
            logits=tuple(logits) if generation_config.output_logits else None,
            cache=cache,
        )
    return sequences


def _check_batch_request(logits_processor, streamer) -> None:
    if streamer is not None:
        _fail(
            "Streamers take one sequence (transformers' TextStreamer raises for batch > 1 too); "
            "stream one prompt at a time, or drop the streamer for a batch."
        )
    for processor in logits_processor:
        name = type(processor).__name__
        if name in _BATCH_STATE_PROCESSORS:
            _fail(
                f"{name} keeps state across the whole batch, which ngram_speculator's batched loop "
                "(rows advance by different amounts) cannot provide; call generate() once per row."
            )


# Processors that keep per-batch state or mix rows: they cannot be applied row by row.
_BATCH_STATE_PROCESSORS = {
    "SynthIDTextWatermarkLogitsProcessor",
    "ClassifierFreeGuidanceLogitsProcessor",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor",
}


def _processors_for_row(logits_processor, row: int):
    """The batched loop applies processors row by row (rows accept different numbers of tokens,
    so their prefixes differ in length), each with a (1, length) prefix. Processors that look
    up a row's index in the batch get a copy bound to that row."""
    if not len(logits_processor):
        return None
    bound = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and torch.is_tensor(processor.prompt_ignore_length):
            # generate() passes each row's left-padding length (B,)
            processor = copy.copy(processor)
            processor.prompt_ignore_length = int(processor.prompt_ignore_length[row])
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            allowed = processor._prefix_allowed_tokens_fn
            processor = PrefixConstrainedLogitsProcessor(functools.partial(_fixed_row, allowed, row), num_beams=1)
        bound.append(processor)
    return bound


def _fixed_row(allowed_tokens_fn, row, _batch_id, sentence):
    return allowed_tokens_fn(row, sentence)


_warned_devices: set = set()


def _warn_if_cpu_curve_on_accelerator(model, speculator) -> None:
    """Once per device type: the default cost curve was measured on a 2-core CPU, and sizes
    drafts too timidly where extra positions are nearly free (a GPU)."""
    device = next(model.parameters()).device.type
    if device != "cpu" and device not in _warned_devices and tuple(speculator.config.verify_cost) == CPU_VERIFY_COST:
        _warned_devices.add(device)
        warnings.warn(f"ngram_speculator sizes drafts with the default verify-cost curve, measured on a CPU; the model "
                      f"is on {device}. NgramSpeculator.for_model(model) measures and caches this device's curve "
                      "(once, seconds).", stacklevel=4)


def _positions_from_mask(input_ids, attention_mask) -> torch.Tensor:
    """(B, P) position ids as generate() prepares them: real tokens count from 0."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def _real_tokens(input_ids, attention_mask, row: int) -> torch.Tensor:
    """Row ``row`` of the prompt without its padding (what the drafter indexes)."""
    if attention_mask is None:
        return input_ids[row]
    return input_ids[row][attention_mask[row].bool()]


def _shared_cache_ok(cache) -> bool:
    """One cache with per-row holes needs plain full-attention dynamic layers."""
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _batch_callables(model, cache):
    """forward / crop / gather for ``batch.speculative_batch`` over a shared DynamicCache."""

    def forward(ids, positions, mask, keep):
        # ids, positions: (A, q); mask: (A, C + q) -> float32 logits (A, keep, V)
        out = model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache,
                    use_cache=True, logits_to_keep=keep)
        return out.logits[:, -keep:].float()

    def crop(m: int) -> None:
        if m:
            cache.crop(-m)

    def gather(rows, columns):
        # rows: (A',) rows to keep; columns: (A, C') per-row columns to keep, in order
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            if rows is not None:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]
            if columns is not None:
                index = columns[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys = layer.keys.gather(2, index)
                layer.values = layer.values.gather(2, index)

    return forward, crop, gather


def _decode_row(model, input_ids, attention_mask, positions, cache, speculator, capacity, streamer=None, **settings):
    """One sequence (1, P), possibly left-padded, through ``decode.speculative_greedy``."""
    prompt_len = input_ids.shape[1]
    # New tokens sit right after the prompt's last real token: position = real tokens so far.
    real_in_prompt = int(attention_mask.sum()) if attention_mask is not None else prompt_len
    mask = torch.ones((1, prompt_len + 4096), dtype=torch.long, device=input_ids.device)
    if attention_mask is not None:
        mask[:, :prompt_len] = attention_mask

    def forward(ids: torch.Tensor, start: int, keep: int, tree=None) -> torch.Tensor:
        # ids: (1, q) at stream positions start..start+q-1; returns float32 logits (keep, V).
        q = ids.shape[1]
        extra = {}
        if start == 0:
            extra["position_ids"] = positions
            extra["attention_mask"] = attention_mask
        elif attention_mask is not None or tree is not None:
            nonlocal mask
            if start + q > mask.shape[1]:
                mask = torch.cat([mask, torch.ones_like(mask)], dim=1)
            first = real_in_prompt + (start - prompt_len)
            if tree is None:
                extra["attention_mask"] = mask[:, : start + q]
                extra["position_ids"] = torch.arange(first, first + q, device=ids.device).unsqueeze(0)
            else:
                depth, visible = tree
                extra["position_ids"] = (first + to_device(depth, ids.device)).unsqueeze(0)
                extra["attention_mask"] = _tree_mask(mask[:, :start], visible, model.dtype)
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep, **extra)
        if start == 0:
            # Sliding-window and linear-attention layers drop old states on update; recording
            # keeps them until the next crop, so rejected draft tokens can be rolled back.
            # (After the prefill, as generate() does: recording during it would hold it all.)
            cache.activate_past_recording()
        return out.logits[0, -keep:].float()

    def crop(m: int) -> None:
        cache.crop(-m)

    session = speculator.start(_real_tokens(input_ids, attention_mask, 0), capacity=capacity)
    trees = speculator.config.tree_branches > 1 and _shared_cache_ok(cache) and \
        model.config._attn_implementation in ("eager", "sdpa")
    result = speculative_greedy(input_ids, session, forward, crop, streamer=streamer,
                                keep_path=functools.partial(_keep_path, cache) if trees else None, **settings)
    session.finish()
    return result


def _tree_mask(past_mask: torch.Tensor, visible, dtype) -> torch.Tensor:
    """Additive float mask (1, 1, q, past + q) for a tree block: past columns as the 2D mask
    says, new columns per ``visible``. (An additive float mask is right for both sdpa and eager
    attention; eager silently misreads a boolean one.)"""
    q = len(visible)
    allowed = torch.cat([past_mask.bool().expand(q, -1),
                         to_device(visible, past_mask.device, torch.bool)], dim=1)
    additive = torch.zeros(allowed.shape, dtype=dtype, device=past_mask.device)
    additive.masked_fill_(~allowed, torch.finfo(dtype).min)
    return additive[None, None]


def _keep_path(cache, rows: list[int], q: int) -> None:
    """Of the last q cache entries keep ``rows`` (in order): compacts the cache to the accepted
    path of a tree (its tokens were not contiguous in the verified block)."""
    indices = {}
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        past, device = layer.keys.shape[2] - q, layer.keys.device
        if (past, device) not in indices:  # one index per device (and length), not per layer
            indices[past, device] = torch.cat([torch.arange(past, device=device), past + to_device(rows, device)])
        index = indices[past, device]
        layer.keys = layer.keys.index_select(2, index)
        layer.values = layer.values.index_select(2, index)


def _join_rows(rows, prompt_len, pad_token_id, settings):
    """Row-by-row results -> a padded batch, as plain generate() returns it."""
    longest = max(r.sequence.shape[1] for r in rows)
    sequences = torch.full((len(rows), longest), pad_token_id, dtype=torch.long, device=rows[0].sequence.device)
    for b, r in enumerate(rows):
        sequences[b, : r.sequence.shape[1]] = r.sequence[0]
    new = [r.sequence[0, prompt_len:].tolist() for r in rows]
    scores = logits = []
    if settings["keep_scores"]:
        scores = stack_per_index([[x[0] for x in r.scores] for r in rows], new, longest - prompt_len, pad_token_id)
    if settings["keep_logits"]:
        logits = stack_per_index([[x[0] for x in r.logits] for r in rows], new, longest - prompt_len, pad_token_id)
    return sequences, scores, logits, [r.stats for r in rows]


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

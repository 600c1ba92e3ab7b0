"""The ``generate()`` hook: ``model.generate(ids, ngram_speculator=spec, ...)``.

Two ways in, one implementation:

* ``model.generate(ids, ngram_speculator=spec, ...)``: :func:`install` (``ngramspec.install()``,
  also called by ``load_model()`` and ``DocumentJob``; importing ngramspec does not) wraps
  ``GenerationMixin.generate`` once. Calls without ``ngram_speculator`` go to the original
  untouched; calls with it are routed through transformers' official extension hook below.
* ``model.generate(ids, custom_generate=ngramspec.ngram_generate, ngram_speculator=spec)``:
  the hook itself. generate() does all of its preparation (config merge, special tokens,
  attention mask, a fresh DynamicCache, logits processors, stopping criteria) and then calls
  :func:`ngram_generate`, which runs the loop of ``decode.py`` on a ``target.HFTarget``.

generate() does not hand its ``streamer`` to a ``custom_generate`` callable, so the wrapper
passes it on as ``ngram_streamer``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from transformers import DynamicCache, GenerationMixin
from transformers.generation import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput
from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria

from ..cost.timer import ForwardTimer
from ..draft.metrics import DecodeStats
from ..draft.speculator import NgramSpeculator
from . import target as hf
from .checks import ASSISTED_CONFLICT, check_batch_request, check_request, fail, passes_positions, warn_if_inexact
from .decode import DecodeResult, Options, speculative_decode, stack_per_index
from .probe import check_model_steps
from .seq2seq import EncoderInputs
from .shallow import SelfDraftingSession, self_drafter, shallow_evidence


def ngram_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    ngram_speculator: NgramSpeculator | None = None,
    ngram_streamer=None,
    ngram_source_ids=None,
    **model_kwargs,
):
    """transformers ``custom_generate`` callable: speculative greedy decoding or sampling.

    Use through ``model.generate(ids, ngram_speculator=spec)``, or explicitly with
    ``model.generate(ids, custom_generate=ngram_generate, ngram_speculator=spec)``.
    A batch (left-padded, with its attention mask; or one prompt expanded by
    ``num_return_sequences``) is verified in one forward per step, each row accepting its own
    number of draft tokens. Afterwards ``ngram_speculator.last_stats`` describes the whole
    call and ``ngram_speculator.last_row_stats`` each row. An encoder-decoder model decodes
    its rows one at a time, drafting from ``ngram_source_ids`` (the encoder's input ids) and its
    output (:mod:`ngramspec.hf.seq2seq`).
    """
    if ngram_speculator is None:
        fail("custom_generate=ngram_generate needs ngram_speculator=NgramSpeculator(...).")
    check_request(model, input_ids, generation_config, model_kwargs, ngram_speculator)
    warn_if_inexact(model, generation_config)
    if synced_gpus:
        fail("synced_gpus (DeepSpeed ZeRO-3 / FSDP) is not supported with ngram_speculator.")
    cache = model_kwargs.get("cache")
    if cache is None:
        cache = model_kwargs.get("past_key_values")
    if cache is None:
        fail(f"generate() prepared no KV cache for {type(model).__name__} (model type "
             f"{getattr(model.config, 'model_type', '?')!r}); ngram_speculator needs one: pass use_cache=True, "
             "or generate without ngram_speculator.")
    batch = input_ids.shape[0]
    if batch > 1:
        check_batch_request(logits_processor, ngram_streamer, stopping_criteria)
    encoder = EncoderInputs(model, model_kwargs, cache, ngram_source_ids) if model.config.is_encoder_decoder else None
    # The decoder's prompt has no padding: the mask generate() prepared is the encoder's.
    attention_mask = model_kwargs.get("attention_mask") if encoder is None else None  # None: no padding
    explicit_positions = encoder is None and passes_positions(model)
    if encoder is None:
        check_model_steps(model, hf.real_tokens(input_ids, attention_mask, 0)[None], cache, explicit_positions)
    else:  # (the source's tokens: the decoder's prompt is one start token)
        source = encoder.source(0)
        check_model_steps(model, (source if len(source) else input_ids[0])[None], cache, False, encoder.row(0, batch))

    gc = generation_config
    positions = hf.text_positions(input_ids, attention_mask, model_kwargs.get("position_ids"))
    config, cost_model = ngram_speculator.config, ngram_speculator.cost_model
    forward_cost = cost_model if config.payoff_sizing else None  # None: a batch drafts all it proposes
    pad = gc._pad_token_tensor
    options = Options(
        stop=hf.stop_rule(stopping_criteria),
        pad_token_id=int(pad) if pad is not None else 0,
        sample=bool(gc.do_sample),
        keep_scores=bool(gc.return_dict_in_generate and gc.output_scores),
        keep_logits=bool(gc.return_dict_in_generate and gc.output_logits),
        forward_cost=forward_cost,
        timer=ForwardTimer(cost_model, input_ids.device) if cost_model.learn else None,
        streamer=ngram_streamer,
    )
    source_length = 0 if encoder is None else max(len(encoder.source(b)) for b in range(batch))
    capacity = min(gc.max_length + source_length, input_ids.shape[1] + source_length + (1 << 16))  # index pre-size

    def decode(rows: range, cache) -> DecodeResult:
        ids = input_ids[rows.start : rows.stop]
        mask = attention_mask[rows.start : rows.stop] if attention_mask is not None else None
        target = hf.HFTarget(model, cache, explicit_positions, encoder and encoder.row(rows.start, batch))
        process = [hf.processors_for_row(logits_processor, b) for b in rows]
        options.process = process if any(p is not None for p in process) else None  # None: no prefix work
        options.trees = len(rows) == 1 and config.tree_branches > 1 and target.trees_ok
        texts = [hf.real_tokens(ids, mask, b) for b in range(len(rows))]  # what each row's drafter indexes
        if encoder is not None:  # the source first: the output copies from it
            texts = [torch.cat([encoder.source(b).to(text.device), text]) for b, text in zip(rows, texts)]
        sessions = [ngram_speculator.start(text, capacity) for text in texts]
        shallow = self_drafter(model, cache, config, sample=options.sample, rows=len(rows), trees=options.trees)
        if shallow is not None:
            evidence = shallow_evidence(ngram_speculator, model)
            sessions = [SelfDraftingSession(session, shallow, evidence, cost_model) for session in sessions]
        result = speculative_decode(ids, mask, positions[rows.start : rows.stop], sessions, target, options)
        for session, stats in zip(sessions, result.stats):
            stats.compiling_steps = getattr(session, "pending_steps", 0)
            session.finish()
            if shallow is not None:
                stats.self_drafted_tokens, stats.self_accepted_tokens = session.drafted, session.accepted
                stats.declined_steps += session.declined  # shallow drafts the sizing rule judged not to pay
        return result

    optimize = getattr(model, "_optimize_model_for_decode", None)
    with optimize() if optimize is not None else contextlib.nullcontext():
        if batch == 1 or (explicit_positions and hf.can_gather(cache)):  # = HFTarget.can_gather
            result = decode(range(batch), cache)
        else:
            # Sliding-window or static caches cannot hold per-row holes: decode row by row,
            # each with its left padding (processors see what plain batched decoding shows).
            new_cache = encoder.new_cache if encoder is not None else lambda: DynamicCache(config=model.config)
            result = _join([decode(range(b, b + 1), new_cache()) for b in range(batch)],
                           input_ids.shape[1], options)
    ngram_speculator.last_row_stats = result.stats
    ngram_speculator.last_stats = result.stats[0] if batch == 1 else DecodeStats.combine(result.stats)
    if gc.return_dict_in_generate:
        output = GenerateDecoderOnlyOutput if encoder is None else GenerateEncoderDecoderOutput
        return output(
            sequences=result.sequences,
            scores=tuple(result.scores) if gc.output_scores else None,
            logits=tuple(result.logits) if gc.output_logits else None,
            # A batch's cache holds masked holes: not one plain decoding could continue from.
            cache=cache if batch == 1 else None,
        )
    return result.sequences


def _join(parts: list[DecodeResult], prompt_len: int, options: Options) -> DecodeResult:
    """Row-by-row results -> one padded batch, as plain generate() returns it."""
    longest = max(p.sequences.shape[1] for p in parts)
    sequences = torch.full((len(parts), longest), options.pad_token_id, dtype=torch.long,
                           device=parts[0].sequences.device)
    for b, part in enumerate(parts):
        sequences[b, : part.sequences.shape[1]] = part.sequences[0]
    new = [part.sequences[0, prompt_len:].tolist() for part in parts]
    result = DecodeResult(sequences, [part.stats[0] for part in parts])
    if options.keep_scores:
        result.scores = stack_per_index([[s[0] for s in p.scores] for p in parts], new, longest - prompt_len,
                                        options.pad_token_id)
    if options.keep_logits:
        result.logits = stack_per_index([[s[0] for s in p.logits] for p in parts], new, longest - prompt_len,
                                        options.pad_token_id)
    return result


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
        fail("stop_strings need the model's tokenizer: pass tokenizer=... to generate().")
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
            fail("ngram_speculator cannot be combined with another custom_generate.")
        if kwargs.get("prompt_lookup_num_tokens") or kwargs.get("assistant_model") is not None:
            fail(ASSISTED_CONFLICT)
        _route_stop_strings(self, kwargs)
        kwargs["custom_generate"] = ngram_generate
        kwargs["ngram_streamer"] = kwargs.pop("streamer", None)
        if self.config.is_encoder_decoder:  # the drafter copies from the encoder's input too
            kwargs["ngram_source_ids"] = inputs
        return original(self, ngram_speculator=ngram_speculator, **kwargs)

    generate._ngramspec_original = original
    return generate


def _wrap_validate_model_kwargs(original):
    """generate() hands ``ngram_speculator`` to :func:`ngram_generate` before it validates the model
    kwargs, so it reaches this check only through a model's own ``generate()`` that bypasses
    ``GenerationMixin.generate`` (MusicGen): refused there, before any forward."""

    @functools.wraps(original)
    def _validate_model_kwargs(self, model_kwargs):
        if model_kwargs.get("ngram_speculator") is not None:
            fail(f"{type(self).__name__} (model type {getattr(self.config, 'model_type', '?')!r}) has its own "
                 "generate(), which bypasses transformers' GenerationMixin.generate, so ngram_speculator cannot take "
                 "over its decoding loop. Generate without ngram_speculator.")
        return original(self, model_kwargs)

    _validate_model_kwargs._ngramspec_original = original
    return _validate_model_kwargs


def speculative_generate(model, *args, ngram_speculator: NgramSpeculator | None = None, **kwargs):
    """``model.generate(*args, ngram_speculator=..., **kwargs)`` without :func:`install` (the entry of
    the repository's ``custom_generate/generate.py``); a default ``NgramSpeculator()`` when none is
    given."""
    original = getattr(GenerationMixin.generate, "_ngramspec_original", GenerationMixin.generate)
    speculator = NgramSpeculator() if ngram_speculator is None else ngram_speculator
    return _wrap_generate(original)(model, *args, ngram_speculator=speculator, **kwargs)


def install() -> None:
    """Let ``model.generate`` accept ``ngram_speculator=``: wraps ``GenerationMixin.generate`` once
    (idempotent: later calls change nothing). Importing ngramspec does not call it;
    ``load_model()`` and ``DocumentJob`` do."""
    if not hasattr(GenerationMixin.generate, "_ngramspec_original"):
        GenerationMixin.generate = _wrap_generate(GenerationMixin.generate)
    if not hasattr(GenerationMixin._validate_model_kwargs, "_ngramspec_original"):
        GenerationMixin._validate_model_kwargs = _wrap_validate_model_kwargs(GenerationMixin._validate_model_kwargs)


def uninstall() -> None:
    """Restore transformers' own ``generate``."""
    original = getattr(GenerationMixin.generate, "_ngramspec_original", None)
    if original is not None:
        GenerationMixin.generate = original
    original = getattr(GenerationMixin._validate_model_kwargs, "_ngramspec_original", None)
    if original is not None:
        GenerationMixin._validate_model_kwargs = original

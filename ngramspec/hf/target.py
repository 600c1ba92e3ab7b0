"""The transformers side of the decode loop: the target model and its cache as a
:class:`~ngramspec.hf.decode.Target`, and generate()'s processors and stopping criteria in the
loop's terms. (Request checks live in ``checks.py``, the ``generate()`` hook in ``hook.py``.)
"""

from __future__ import annotations

import copy
import functools
import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    LogitsProcessorList,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from .checks import check_cache, fail
from .decode import StopRule
from .transfer import to_device


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows as one left-padded batch, as ``generate()`` takes it: (ids (B, W), attention
    mask (B, W)), W the longest row."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
        mask[b, width - len(row) :] = 1
    return ids, mask


class HFTarget:
    """A causal LM and its KV cache (a :class:`~ngramspec.hf.decode.Target`). For an
    encoder-decoder model, ``encoder`` holds one row's encoder inputs (``encoder_outputs`` and
    the encoder's ``attention_mask``): the loop's tokens then feed the decoder, whose
    self-attention cache is the one rolled back (the cross-attention cache never changes)."""

    def __init__(self, model, cache, explicit_positions: bool | None = None, encoder: dict | None = None):
        self.model = model
        self.cache = cache
        self._encoder = encoder
        decoder_cache = getattr(cache, "self_attention_cache", cache)  # what drafts write to
        # Rows with holes need explicit positions. A model that generate() gives none (see
        # checks.passes_positions) counts them itself, pads included: the loop gives none too,
        # and its rows decode one at a time, each with its own padding.
        # (A decoder of one row, with no holes, counts its positions from its cache.)
        self._positions = (encoder is None and _takes(model, "position_ids") if explicit_positions is None
                           else explicit_positions and encoder is None)
        self.can_gather = can_gather(cache) and self._positions
        self.trees_ok = self.can_gather and model.config._attn_implementation in ("eager", "sdpa")
        self._prefilled = False
        self._recurrent: list = []  # layers with recurrent states (set after the prefill)
        self._static = any(hasattr(layer, "max_cache_len") for layer in decoder_cache.layers)
        self._crop_checked = False
        self._length = 0  # columns in the cache (kept here: reading a static cache's length syncs)
        self._records = any(hasattr(layer, "record_past") for layer in decoder_cache.layers)
        crops = [(layer, _attention_crop(layer)) for layer in decoder_cache.layers]
        self._uncropped = [(layer, crop) for layer, crop in crops if crop is not None]
        # A cache of recurrent layers only (Mamba-style): the left padding is folded into each
        # row's state by the prefill, and later forwards take no mask (as generate() passes them).
        self._states_only = bool(decoder_cache.layers) and all(
            hasattr(layer, "recurrent_states") and not hasattr(layer, "keys") for layer in decoder_cache.layers)
        self._layers = decoder_cache.layers
        self._decoder_cache = decoder_cache

    def forward(self, ids, positions, mask, keep: int, visible=None) -> torch.Tensor:
        # ids, positions: (A, q); mask: (A, C + q) or None; visible: (q, q) -> logits (A, keep, V)
        if visible is not None:
            mask = _tree_mask(mask, self.cache.get_seq_length(), visible, self.model.dtype, ids.device)
        self._last_q = ids.shape[1]
        self._last_inputs = (ids, positions, mask)  # for a replay (see crop)
        if self._prefilled:
            self._keep_states(ids.shape[1])
            if self._states_only:
                mask = None
        if mask is None and self._static and self._encoder is None:
            # A static cache's unwritten slots must be masked; with recording on (a recurrent
            # layer) transformers stops masking them unless it is given a mask.
            mask = torch.ones((ids.shape[0], self._length + ids.shape[1]), dtype=torch.long, device=ids.device)
        self._length += ids.shape[1]
        out = model_forward(self.model, ids, self.cache, keep, positions if self._positions else None, mask,
                            self._encoder)
        if not self._prefilled:
            # Sliding-window and linear-attention layers drop old states on update; recording
            # keeps them until the next crop, so rejected draft tokens can be rolled back.
            # (After the prefill, as generate() does: recording during it would hold it all.)
            check_cache(self.model, self.cache)  # some layers know only once filled
            self.cache.activate_past_recording()
            self._recurrent = [layer for layer in self._layers if hasattr(layer, "recurrent_states_history")]
            for layer in self._recurrent:  # one list per state (transformers shares one list among them)
                layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}
            self._prefilled = True
        return out.logits[:, -keep:].float()

    def _replays(self) -> bool:
        """Whether the last forward must be replayed to roll back: a recurrent layer that recorded
        fewer states than tokens (Zaya: only the state before the forward)."""
        short = False
        for layer in self._recurrent:
            for i, history in layer.recurrent_states_history.items():
                if layer.is_recurrent_states_initialized[i] and len(history) < self._last_q:
                    if not history:
                        fail(f"{type(self.model).__name__} (model type "
                             f"{getattr(self.model.config, 'model_type', '?')!r}) records no recurrent state for a "
                             "forward, so rejected draft tokens cannot be rolled back. Generate without "
                             "ngram_speculator.")
                    short = True
        return short

    def _replay(self, m: int) -> None:
        """Roll the last forward (q tokens) back whole, then run its first q - m tokens again.
        Layers that recorded only the state before the forward can return to that state alone;
        the replay costs one more forward, only on a step whose draft was cut short."""
        ids, positions, mask = self._last_inputs
        q = ids.shape[1]
        for layer in self._recurrent:  # crop(-q) restores history[-q]: the state before the forward
            for i, history in layer.recurrent_states_history.items():
                if layer.is_recurrent_states_initialized[i]:
                    layer.recurrent_states_history[i] = [history[0]] * q
        self._crop_cache(q)
        self._length -= q
        kept = q - m
        self.forward(ids[:, :kept], positions[:, :kept], None if mask is None else mask[:, : mask.shape[1] - m], 1)
        self._crop_cache(0)

    def _keep_states(self, q: int) -> None:
        """Recurrent (linear-attention, SSM) layers roll back only to the states they were asked to
        record: a forward over q tokens records the state after each of them (crop keeps >= 1)."""
        for layer in self._recurrent:
            layer.recurrent_states_to_keep = q

    def crop(self, m: int) -> None:
        if m and self._replays():
            self._replay(m)
        else:
            self._crop(m)
        if m and not self._crop_checked:  # the first real rollback: did every layer follow it?
            self._crop_checked = True
            lengths = {int(layer.get_seq_length()) for layer in self._layers if hasattr(layer, "get_seq_length")}
            if lengths - {0, self._length}:
                fail(f"{type(self.cache).__name__} of {type(self.model).__name__} (model type "
                     f"{getattr(self.model.config, 'model_type', '?')!r}) did not roll back all its layers "
                     f"({sorted({type(layer).__name__ for layer in self._layers})}), so rejected draft tokens "
                     "would stay in it. Use the default dynamic cache, or generate without ngram_speculator.")

    def _crop(self, m: int) -> None:
        self._length -= m
        # Every step, even m == 0: recording layers (sliding window, linear attention) keep all
        # they were given until a crop trims them back to their working size.
        if m or self._recurrent or self._records:
            self._crop_cache(m)

    def _crop_cache(self, m: int) -> None:
        self._decoder_cache.crop(-m)  # (an encoder-decoder's crop refuses a static cache: its decoder's part crops)
        for layer, crop_attention in self._uncropped:
            crop_attention(layer, -m)

    def gather(self, rows, columns) -> None:
        # rows: (A',) cache rows to keep; columns: (A, C') per-row columns to keep, in order
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            if rows is not None:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]
            if columns is not None:
                self._length = columns.shape[1]
                index = columns.to(layer.keys.device)[:, None, :, None]
                index = index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys = layer.keys.gather(2, index)
                layer.values = layer.values.gather(2, index)


def model_forward(model, ids, cache, keep: int, positions=None, mask=None, encoder: dict | None = None):
    """One forward of ``model`` over ``ids`` (A, q) on top of ``cache``: a causal LM's, or with
    ``encoder`` an encoder-decoder's decoder (whose own mask is never needed: its rows decode one
    at a time, without holes). Logits of at least the last ``keep`` positions."""
    if encoder is None:
        given = {} if positions is None else {"position_ids": positions}
        return model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=keep, **given)
    if mask is not None:
        raise ValueError("an encoder-decoder's decoder rows decode one at a time, with no mask")
    given = {"logits_to_keep": keep} if _takes(model, "logits_to_keep") else {}  # (BART, T5 take none)
    return model(decoder_input_ids=ids, cache=cache, use_cache=True, **encoder, **given)


def _takes(model, name: str) -> bool:
    return name in _forward_parameters(type(model))


@functools.cache
def _forward_parameters(model_class) -> frozenset:
    """The names a model class's forward takes: read once per class (a decode step asks every
    forward, and inspect.signature costs tens of microseconds)."""
    return frozenset(inspect.signature(model_class.forward).parameters)


def _attention_crop(layer):
    """The attention part's crop of a hybrid layer whose own crop rolls back only its linear
    part (transformers 5.25's linear-attention-and-static layers inherit the linear crop alone),
    or None."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    linear = LinearAttentionCacheLayerMixin
    if not isinstance(layer, linear) or type(layer).crop is not linear.crop:
        return None
    attention = [c for c in type(layer).__mro__ if "crop" in vars(c) and not issubclass(c, linear)]
    return vars(attention[0])["crop"] if attention else None


def can_gather(cache) -> bool:
    """Per-row holes, row removal and tree paths select cache columns: plain full-attention
    dynamic layers only (a static or sliding-window cache can only be cropped)."""
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _tree_mask(mask, past: int, visible, dtype, device) -> torch.Tensor:
    """Additive float mask (1, 1, q, past + q) for a tree block: past columns as the 2D mask
    says (all visible when None), new columns per ``visible``. (An additive float mask is right
    for both sdpa and eager attention; eager silently misreads a boolean one.)"""
    q = len(visible)
    past_mask = torch.ones((1, past), dtype=torch.bool, device=device) if mask is None else mask[:, :past].bool()
    allowed = torch.cat([past_mask.expand(q, -1), to_device(visible, device, torch.bool)], dim=1)
    additive = torch.zeros(allowed.shape, dtype=dtype, device=device)
    additive.masked_fill_(~allowed, torch.finfo(dtype).min)
    return additive[None, None]


def stop_rule(stopping_criteria: StoppingCriteriaList) -> StopRule:
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


def processors_for_row(logits_processor, row: int):
    """The loop applies processors row by row (rows accept different numbers of tokens, so
    their prefixes differ in length), each with a (1, length) prefix. Processors that look up
    a row's index in the batch get a copy bound to that row. None: no processors."""
    if not len(logits_processor):
        return None
    bound = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and torch.is_tensor(processor.prompt_ignore_length):
            # generate() passes each row's left-padding length (B,)
            processor = copy.copy(processor)
            processor.prompt_ignore_length = int(processor.prompt_ignore_length[row])
        elif isinstance(processor, EncoderNoRepeatNGramLogitsProcessor) and processor.batch_size > 1:
            processor = copy.copy(processor)  # the row's own prompt n-grams, as a batch of one
            processor.generated_ngrams, processor.batch_size = [processor.generated_ngrams[row]], 1
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            allowed = processor._prefix_allowed_tokens_fn
            processor = PrefixConstrainedLogitsProcessor(functools.partial(_fixed_row, allowed, row), num_beams=1)
        bound.append(processor)
    return bound


def _fixed_row(allowed_tokens_fn, row, _batch_id, sentence):
    return allowed_tokens_fn(row, sentence)


def positions_from_mask(input_ids, attention_mask) -> torch.Tensor:
    """(B, P) position ids as generate() prepares them: real tokens count from 0."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def text_positions(input_ids, attention_mask, prepared) -> torch.Tensor:
    """(B, P) position ids: generate()'s own when it prepared 2-D ones, else counted from the
    mask. Multimodal-rope models get (sections, B, P) ids, all equal to the text positions for
    a text-only prompt (the model expands 2-D ones itself) at the real tokens (padding's, which no
    real token attends to, may differ: some fill them with 1); any other layout is refused."""
    positions = positions_from_mask(input_ids, attention_mask)
    if prepared is None or prepared.dim() == 2:
        return positions if prepared is None else prepared
    real = torch.ones_like(positions, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if prepared.dim() == 3 and all(torch.equal(p[real], positions[real].to(p.dtype))
                                   for p in prepared.reshape(-1, *positions.shape)):
        return positions
    fail("ngram_speculator handles text positions only; generate() prepared position ids of shape "
         f"{tuple(prepared.shape)} that are not the text's (a multimodal input?). Generate without ngram_speculator.")


def real_tokens(input_ids, attention_mask, row: int) -> torch.Tensor:
    """Row ``row`` of the prompt without its padding (what the drafter indexes)."""
    if attention_mask is None:
        return input_ids[row]
    return input_ids[row][attention_mask[row].bool()]

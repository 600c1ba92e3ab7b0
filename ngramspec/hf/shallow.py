"""Self-speculation: the target model run through a subset of its own decoder layers (the first
k, or all but a skipped middle set), sharing its weights and its KV cache, and the drafter that
``SpeculatorConfig.self_draft_layers`` turns on in generate() (off by default: on the 2-core CPU
it does not pay, see the README's "Self-speculation" and ``python -m eval selfspec``).

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

import statistics
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from ..draft.proposal import Draft
from ..draft.sizing import padded_lengths
from .checks import fail
from .target import can_gather


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


class ShallowEvidence:
    """What a speculator has learned of its shallow drafter, over all its requests, and the
    sizing rule's inputs from it (:meth:`length`):

    - the agreement a, the chance a shallow draft token is accepted given the one before it was:
      (accepted + prior x weight) / (accepted + refused + weight), from ``acceptance_prior`` with
      the weight of ``draft_tuning.request_weight`` positions;
    - the cost c of one shallow forward relative to a plain step at the same context: the median
      of its last timings, each over the cost model's plain-step time there (prior until both are
      measured: the share of the layers it runs, as its weights are read in that share).
    """

    def __init__(self, config, layers_run: int, layers: int):
        self.prior, self.weight = config.acceptance_prior, config.draft_tuning.request_weight
        self.prior_cost = layers_run / layers
        self.accepted = self.refused = 0
        self.costs: deque = deque(maxlen=15)  # shallow seconds / plain-step seconds, newest last

    @property
    def agreement(self) -> float:
        return (self.accepted + self.prior * self.weight) / (self.accepted + self.refused + self.weight)

    @property
    def cost(self) -> float:
        return statistics.median(self.costs) if self.costs else self.prior_cost

    def timed(self, seconds: float, plain_seconds: float | None) -> None:
        if plain_seconds:
            self.costs.append(seconds / plain_seconds)

    def length(self, cost_model, context: int, limit: int) -> int:
        """The one sizing rule (:mod:`ngramspec.draft.sizing`) over a shallow draft: m tokens,
        each accepted with the agreement given the one before, cost one verify over m + 1
        tokens plus m shallow forwards; 0 (no draft) where a plain step emits more per cost.
        A step of the first 28 of the default model's 30 layers (c ~0.92, a ~0.47) never pays
        on the 2-core CPU: m = 1 emits 1.47 tokens for 1.13 + 0.92 plain steps."""
        if limit <= 0:
            return 0
        costs = np.array([cost_model(m + 1, context) + m * self.cost for m in range(limit + 1)])
        lengths, _ = padded_lengths(np.full((1, limit), self.agreement), np.array([limit], dtype=np.int64), costs)
        return int(lengths[0])


class ShallowDrafter:
    """Greedy drafts from layers ``kept`` of ``model``, on the target's own cache ``cache``.

    Between decode steps the cache holds every token but the last emitted one (the decode
    loop's invariant), so a draft starts by feeding that token. Each of the ``tokens`` shallow
    forwards adds one entry to the kept layers only; all are cropped before returning, so the
    verify forward over [last, *draft] finds the cache as it left it. With ``kept`` a prefix of
    the layers, a draft token the target accepts had exactly the keys and values the full
    forward gives it in those layers (they never see later layers); that reuse is left out here.
    """

    def __init__(self, model, cache, kept: Sequence[int], tokens: int):
        self.model, self.cache, self.kept, self.tokens = model, cache, tuple(kept), tokens
        self.seconds_per_token = 0.0  # the latest draft's time per shallow forward

    def draft(self, last: int, max_tokens: int) -> list[int]:
        device = self.model.device
        token, drafted = last, []
        started = time.perf_counter()
        with running_layers(self.model, self.kept):
            for _ in range(max(0, min(self.tokens, max_tokens))):
                # positions default to the cache's length onward (a batch of one has no padding)
                logits = self.model(input_ids=torch.tensor([[token]], device=device), cache=self.cache,
                                    use_cache=True, logits_to_keep=1).logits  # (1, 1, V)
                token = int(logits[0, -1].argmax())  # reads the device: the time below is the forwards'
                drafted.append(token)
        if drafted:
            self.seconds_per_token = (time.perf_counter() - started) / len(drafted)
        crop_layers(self.cache, self.kept, len(drafted))
        return drafted


class SelfDraftingSession:
    """A request's n-gram session, with ``drafter``'s shallow drafts where the n-gram index has
    no match at all (a match that payoff sizing declined stays a plain step), as long as the
    sizing rule says they pay (:meth:`ShallowEvidence.length`; with ``payoff_sizing`` off,
    always ``self_draft_tokens``). ``self_draft_only``: the n-gram drafts are not used (to
    measure self-speculation alone). Counts the shallow tokens drafted and accepted and the
    steps the rule declined; everything else is the wrapped session's."""

    def __init__(self, session, drafter: ShallowDrafter, evidence: ShallowEvidence, cost_model):
        self.session, self.drafter, self.evidence, self.cost_model = session, drafter, evidence, cost_model
        self.drafted = self.accepted = self.declined = 0
        self._pending: list[int] = []

    def propose(self, max_tokens: int | None = None, sized: bool = True, tree: bool = True) -> Draft:
        config = self.session.config
        copies = 0 if config.self_draft_only else max_tokens  # 0: the n-gram session drafts nothing
        proposal = self.session.propose(max_tokens=copies, sized=sized, tree=tree)
        self._pending = []
        if not config.self_draft_only and (len(proposal) or proposal.source_start >= 0):
            return proposal
        limit = self.drafter.tokens if max_tokens is None else min(self.drafter.tokens, max_tokens)
        context = len(self.session.tokens)
        if sized and config.payoff_sizing:
            limit = self.evidence.length(self.cost_model, context, limit)
            self.declined += limit == 0
        self._pending = self.drafter.draft(int(self.session.tokens[-1]), limit)
        if self._pending:
            self.evidence.timed(self.drafter.seconds_per_token, self.cost_model.plain_seconds(context))
        self.drafted += len(self._pending)
        return Draft(np.asarray(self._pending, dtype=np.int32))

    def extend(self, accepted_tokens, verified: int | None = None) -> None:
        # Greedy: the emitted tokens are the accepted draft tokens, then the target's own.
        emitted = [int(t) for t in accepted_tokens]
        agree = 0
        while agree < min(len(self._pending), len(emitted)) and self._pending[agree] == emitted[agree]:
            agree += 1
        self.accepted += agree
        self.evidence.accepted += agree
        self.evidence.refused += agree < len(self._pending)  # the first refusal ends a draft's run
        self._pending = []
        self.session.extend(accepted_tokens, verified=verified)

    def __getattr__(self, name):
        return getattr(self.session, name)


def self_drafter(model, cache, config, *, sample: bool, rows: int, trees: bool) -> ShallowDrafter | None:
    """The shallow drafter ``config.self_draft_layers`` asks for, or None: off (0), sampling
    (a shallow draft is a greedy point mass; exact sampling would need the drafter's own
    distribution in the rejection test), a batch, token trees, an encoder-decoder, or a cache
    other than plain dynamic layers (its layers are cropped one by one)."""
    depth = config.self_draft_layers
    if not depth or sample or rows != 1 or trees or model.config.is_encoder_decoder:
        return None
    layers = len(decoder_layers(model))
    if depth > layers:
        fail(f"self_draft_layers={depth}, but {type(model).__name__} has {layers} decoder layers; "
             f"give at most {layers}, or 0 (off).")
    if not can_gather(cache):
        return None
    return ShallowDrafter(model, cache, prefix_layers(depth), config.self_draft_tokens)


def shallow_evidence(speculator, model) -> ShallowEvidence:
    """The speculator's evidence about its shallow drafter on ``model`` (kept across calls)."""
    config = speculator.config
    key = (id(model), config.self_draft_layers)
    store = speculator.__dict__.setdefault("_shallow_evidence", {})
    if key not in store:
        store[key] = ShallowEvidence(config, config.self_draft_layers, len(decoder_layers(model)))
    return store[key]

"""The n-gram speculator and its per-request session (start -> propose/extend -> done).

    spec = NgramSpeculator(max_n=4)
    session = spec.start(prompt_ids)       # index the prompt
    draft = session.propose()              # Draft: tokens copied from after an earlier match
    ...verify draft with the target model...
    session.extend(emitted_tokens)         # accepted draft tokens + the target's own token

``generate(ngram_speculator=spec)`` drives exactly this API; so do the trace replayer and any
other decode loop. A speculator holds settings, the acceptance evidence pooled over its
requests (so a request starts from what earlier ones showed, :mod:`ngramspec.draft.acceptance`) and
its cost model; per-request state lives in sessions, so one speculator can serve many calls
(its ``last_stats`` describe the latest generate call).
"""

from __future__ import annotations

from ..cost.costmodel import OnlineCost
from . import compiling
from .acceptance import new_evidence
from .config import SpeculatorConfig, config_with
from .history import History
from .session import SpeculationSession
from .tuning import fixed_cost_model


class NgramSpeculator:
    """Prompt-lookup drafter: proposes continuations copied from earlier in the same text.

    ``NgramSpeculator()`` uses the defaults of :class:`SpeculatorConfig`; pass a config, or its
    fields as keyword arguments (``NgramSpeculator(max_n=3)``). Construction loads the drafting
    kernels from Numba's on-disk cache, so no request pays the JIT; on a fresh install it starts
    compiling them in a second process instead, and requests decode without drafts until they
    are ready (:mod:`ngramspec.draft.compiling`).
    After each ``generate(..., ngram_speculator=spec)`` call, ``spec.last_stats`` holds that
    call's :class:`~ngramspec.draft.metrics.DecodeStats`.
    """

    def __init__(self, config: SpeculatorConfig | None = None, **settings):
        if config is not None and not isinstance(config, SpeculatorConfig):
            raise TypeError(f"config must be a SpeculatorConfig, got {type(config).__name__}.")
        config = config_with(config or SpeculatorConfig(), settings)  # every route's parser
        self.config = config
        self.last_stats = None  # DecodeStats of the latest generate() call (a batch: all rows)
        self.last_row_stats: list = []  # one DecodeStats per row of that call
        self.history = History(config) if config.history_tokens > 0 else None
        # One cost model per speculator (a model on a device), shared by its calls; with
        # verify_cost=None it starts from the CPU prior and learns from their forward timings.
        self.cost_model = (OnlineCost(tuning=config.cost_tuning) if config.verify_cost is None
                           else fixed_cost_model(config))
        # Acceptance evidence pooled over this speculator's requests (ngramspec.draft.acceptance).
        self.pool = new_evidence()
        compiling.prepare(with_index=self.history is not None)  # a history is an NgramIndex from Python

    @classmethod
    def for_model(cls, model, max_age_days: float = 30.0, **settings) -> NgramSpeculator:
        """A speculator whose draft sizing uses ``model``'s own verify-cost curve on its device,
        measured once (tens of seconds) and cached per model, device, dtype and torch version
        (see :mod:`ngramspec.cost.curves`); ``settings`` as for the constructor."""
        from ..cost.curves import cached_cost_curve

        return cls(verify_cost=cached_cost_curve(model, max_age_days), **settings)

    def start(self, prompt_ids, capacity: int = 0) -> SpeculationSession | compiling.PendingSession:
        """Begin a request: index ``prompt_ids`` (1-D ints). ``capacity`` pre-sizes the index's
        token stream for the expected total length (prompt + new tokens); it grows on demand
        anyway, and its n-gram table grows with what the text stores.
        Call ``session.finish()`` at the end so the output joins the history (if enabled).
        While the kernels compile (a fresh install): a :class:`~ngramspec.draft.compiling.PendingSession`."""

        def session(prompt):
            return SpeculationSession(self.config, prompt, capacity, history=self.history, cost_model=self.cost_model,
                                      pool=self.pool)

        if compiling.ready():
            return session(prompt_ids)
        return compiling.PendingSession(self.config, prompt_ids, session)  # kernels still compiling

    def __repr__(self) -> str:
        return f"NgramSpeculator({self.config})"

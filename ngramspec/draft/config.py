"""Every knob of the speculator, in one frozen dataclass validated at construction, and the
one parser of ``name=value,...`` settings text that every command line uses."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from ..cost.curves import DEFAULT_CPU_CURVE, CostCurve

MATCH_POLICIES = ("recent", "earliest")

# The 2-core CPU's verify-cost points at 400 tokens of context (costs.DEFAULT_CPU_CURVE; the
# first curve of the online model's prior): ``verify_cost=CPU_VERIFY_COST`` fixes them.
CPU_VERIFY_COST = DEFAULT_CPU_CURVE.points


def parse_settings(text: str) -> dict[str, str]:
    """``"min_n=1, max_n=4"`` -> ``{"min_n": "1", "max_n": "4"}`` (values still text). A part
    without ``=`` continues the previous value, so a value may hold commas:
    ``verify_cost=1:1.0,8:1.5``."""
    values: dict[str, str] = {}
    name = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" in part:
            name, value = (s.strip() for s in part.split("=", 1))
            values[name] = value
        elif name is not None:
            values[name] += "," + part
        else:
            raise ValueError(f"expected name=value in {text!r}")
    return values


@dataclass(frozen=True)
class SpeculatorConfig:
    """Settings of an :class:`~ngramspec.NgramSpeculator`.

    Attributes:
        min_n: shortest suffix n-gram that may trigger a draft. 1 lets a single repeated token
            propose a continuation: often wrong (a common token recurs everywhere), but right
            where the output resumes copying after an edit; payoff sizing keeps separate
            acceptance per match length, so weak 1-token matches get short or no drafts.
            (Replay over 120 traces: 1 beats 2 by 0.5% on this CPU's cost curve, 1.6% on a
            steeper one.)
        max_n: longest suffix n-gram looked up. The longest match in ``[min_n, max_n]`` wins,
            because a longer shared context predicts the continuation better.
        max_draft_tokens: most tokens proposed per step (the verify pass is this plus one).
            A cap only: payoff sizing picks each draft's length from its acceptance and the
            verify cost, so a high cap lets long verbatim copies run (SuffixDecoding drafts
            24+ tokens there). Replay of the 100 shared traces, 24 against 12: 1.92x vs 1.89x
            on this CPU's curve at 400 tokens of context, 1.71x vs 1.65x at 2,000, 1.80x vs
            1.75x on a steeper one; end to end (20 items x 192 tokens) 1.66x vs 1.60x greedy.
        match: which earlier occurrence of the matched n-gram to copy from: ``"recent"`` (the
            latest one; the model usually continues the text it copied last) or ``"earliest"``
            (the first one, as vLLM's proposer does).
        payoff_sizing: size each draft to maximise expected tokens per unit of verify cost,
            using a per-position acceptance estimate learned from this request and the
            speculator's earlier ones (:mod:`ngramspec.draft.acceptance`); a draft that is not
            expected to pay is not proposed (a plain step). False:
            always draft as much as the match offers, up to ``max_draft_tokens``.
        verify_cost: None, "auto" on a command line (the default): draft sizing asks a cost model that knows
            the context length and refines itself from the decode loop's own forward timings
            (:class:`~ngramspec.cost.costmodel.OnlineCost`; its prior was measured on a 2-core CPU
            at 400, 2,000 and 8,000 tokens of context). Or ``((q, relative_cost), ...)``: a
            fixed curve, the cost of one forward over q tokens relative to one token, linear in
            between; beyond the last point cost grows in proportion to q (a batch of rows x
            positions is costed as that many tokens); never refined.
        acceptance_prior: prior probability that a drafted token is accepted given the one
            before it was, before this speculator's requests have shown acceptance after
            matches of that length (a floor: longer matches start higher, see
            :mod:`ngramspec.draft.acceptance`).
        acceptance_memory: decay, per declined or unverified draft, of the request's
            evidence for that match length, so the request drifts back to the prior and tries
            again (the speculator's pooled evidence does not fade).
        copy_cursor: while the output copies an earlier span token by token, keep drafting
            from that span (locality) before asking the index; the cursor breaks on the first
            token that differs and the index takes over. (Replay: neutral to +0.9%.)
        fuzzy_resync: after the copy breaks (the model changed a word), re-find the place in
            the copied text that best aligns with the tokens emitted since (token Levenshtein
            similarity, rapidfuzz) and resume copying there. (Replay: +1.0 to +1.3%.)
        tree_branches: candidate continuations verified together as a token tree (1: a plain
            chain). Extra branches only take positions the cost curve says are nearly free.
            Off by default: in replay on the 2-core CPU curve trees gained 0.25% (and lost 0.2%
            on a steeper curve); they are for devices where extra positions are free (GPUs).
        max_tree_tokens: most tokens in a tree draft (all branches together; the chain may take
            max_draft_tokens of them, the other branches the rest).
        history_tokens: size of a store of earlier outputs shared by all calls of one
            speculator, drafted from where it matches a longer context than the request's
            own text (0: off). Opt-in, as it carries text from one request into another;
            replay over a job of similar documents: +2.2-2.8% overall, +6% on code editing,
            with 50,000 tokens.
        edit_recurrence: edits recur: once the output has replaced a span of the prompt it
            copies (A, up to 8 tokens) by something else (B) and gone back to copying, later
            drafts copied from the prompt write B where the prompt holds A (a rename, a spelling
            fix applied throughout); an edit the target refuses is forgotten. Opt-in, and not in
            the vLLM drafter: replay of the 220 greedy traces moves -0.1% to +0.1% (their edits
            rarely recur); a rename repeated through a text needs 27 verify passes instead of 119.
    """

    min_n: int = 1
    max_n: int = 6
    max_draft_tokens: int = 24
    match: str = "recent"
    payoff_sizing: bool = True
    verify_cost: tuple | None = None
    acceptance_prior: float = 0.5
    acceptance_memory: float = 0.9
    copy_cursor: bool = True
    fuzzy_resync: bool = True
    tree_branches: int = 1
    max_tree_tokens: int = 32
    history_tokens: int = 0
    edit_recurrence: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"SpeculatorConfig.{f.name} must be an int, got {value!r}.")
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise TypeError(f"SpeculatorConfig.{f.name} must be True or False, got {value!r}.")
        if self.min_n < 1:
            raise ValueError(f"min_n must be >= 1 (got {self.min_n}): an n-gram has at least one token.")
        if self.max_n < self.min_n:
            raise ValueError(
                f"max_n ({self.max_n}) must be >= min_n ({self.min_n}); set max_n to at least min_n."
            )
        if self.max_n > 64:
            raise ValueError(f"max_n must be <= 64 (got {self.max_n}); longer keys only add lookup cost.")
        if self.max_draft_tokens < 1:
            raise ValueError(
                f"max_draft_tokens must be >= 1 (got {self.max_draft_tokens}); to decode without "
                "speculation, call generate() without ngram_speculator."
            )
        if self.tree_branches < 1:
            raise ValueError(f"tree_branches must be >= 1 (got {self.tree_branches}); 1 drafts a plain chain.")
        if self.max_tree_tokens < self.max_draft_tokens:
            raise ValueError(
                f"max_tree_tokens ({self.max_tree_tokens}) must be >= max_draft_tokens ({self.max_draft_tokens})."
            )
        if self.history_tokens < 0:
            raise ValueError(f"history_tokens must be >= 0 (got {self.history_tokens}); 0 turns history off.")
        if self.match not in MATCH_POLICIES:
            raise ValueError(f"match must be one of {MATCH_POLICIES}, got {self.match!r}.")
        if not 0.0 < self.acceptance_prior < 1.0:
            raise ValueError(f"acceptance_prior must be in (0, 1), got {self.acceptance_prior}.")
        if not 0.0 <= self.acceptance_memory <= 1.0:
            raise ValueError(f"acceptance_memory must be in [0, 1], got {self.acceptance_memory}.")
        if self.verify_cost is not None:  # validated (its messages), kept as normalised points
            object.__setattr__(self, "verify_cost", CostCurve(self.verify_cost).points)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Each setting's first sentence from the Attributes section above (for --help texts)."""
        described, name = {}, None
        for line in (cls.__doc__ or "").partition("Attributes:")[2].splitlines():
            head, sep, rest = line.strip().partition(": ")
            if line.startswith(" " * 8) and not line.startswith(" " * 9) and sep and head.isidentifier():
                name, described[head] = head, rest
            elif name is not None and line.strip():
                described[name] += " " + line.strip()
        plain = {n: re.sub(r"``([^`]+)``", r"\1", re.sub(r":\w+:`~?([^`]+)`", r"\1", text))  # no Sphinx markup
                 for n, text in described.items()}
        return {n: text.split(". ")[0].rstrip(".") + "." for n, text in plain.items()}

    @classmethod
    def parse_value(cls, name: str, text: str):
        """Convert a command-line string to the type of field ``name`` (for CLIs)."""
        defaults = {f.name: f.default for f in fields(cls)}
        if name not in defaults:
            raise ValueError(f"unknown speculator setting {name!r}; known: {', '.join(defaults)}")
        default = defaults[name]
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{name} must be true or false, got {text!r}")
        if name == "verify_cost":  # "auto", or "1:1.0,4:1.4,8:1.5"
            return None if text.strip().lower() == "auto" else CostCurve.parse(text).points
        try:
            return type(default)(text)
        except ValueError:
            kind = {"int": "an integer", "float": "a number"}.get(type(default).__name__, type(default).__name__)
            raise ValueError(f"{name} must be {kind}, got {text!r}") from None

    @classmethod
    def from_overrides(cls, text: str, base: SpeculatorConfig | None = None) -> SpeculatorConfig:
        """``"min_n=1,max_draft_tokens=8"`` -> a config (``base`` or the defaults, overridden).
        Commas inside a verify_cost value are allowed: ``verify_cost=1:1.0,8:1.5``."""
        values = parse_settings(text)
        settings = {n: cls.parse_value(n, v) for n, v in values.items()}
        base = base or cls()
        return cls(**{**{f.name: getattr(base, f.name) for f in fields(cls)}, **settings})

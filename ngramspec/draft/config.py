"""Every knob of the speculator, in one frozen dataclass validated at construction, and the
one settings parser every route uses: keyword arguments (``NgramSpeculator(max_n=4)``), the
command line's flags, ``NGRAMSPEC_SETTINGS`` (vLLM) and ``ngramspec:max_n=4`` method strings
all end in :func:`config_with`, text on the way through :func:`read_setting`, so one name and
one value give one config, or one :class:`SettingError`, whichever way they came."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, is_dataclass, replace

from ..cost.costmodel import CostModelTuning, check_numbers
from ..cost.curves import DEFAULT_CPU_CURVE, CostCurve

MATCH_POLICIES = ("recent", "earliest")

# The 2-core CPU's verify-cost points at 400 tokens of context (costs.DEFAULT_CPU_CURVE; the
# first curve of the online model's prior): ``verify_cost=CPU_VERIFY_COST`` fixes them.
CPU_VERIFY_COST = DEFAULT_CPU_CURVE.points


class SettingError(ValueError, TypeError):
    """A bad setting, by whichever route it came: the message names the setting and what it
    takes. Both a ValueError (a bad value) and a TypeError (a value of the wrong type), so a
    caller that catches either one sees every bad setting."""


@dataclass(frozen=True)
class DraftTuning:
    """The drafting engine's finer rules, each as measured when it was chosen; the defaults are
    what every figure in this project used.

    Attributes:
        fuzzy_window: tokens after a copy broke during which fuzzy re-alignment is tried.
        fuzzy_context: last emitted tokens compared when re-aligning.
        fuzzy_ahead: how far past the expected place re-alignment searches.
        fuzzy_below_n: re-alignment outranks index matches shorter than this many tokens.
        edit_span: longest span an edit replaces, or writes (``edit_recurrence``).
        max_edits: edits one request remembers; the oldest goes.
        tree_cost_slack: tree branches take positions while the forward costs at most this
            fraction more than verifying the chain alone.
        explore_below: with a cost model that has not timed a plain step at this context, a draft
            expected to gain less than this factor over a plain step gives way to one (timed).
        first_risk: plain steps a request's first drafts may lose before its own drafts have
            earned any (the loss budget, ``max_loss``; :class:`~ngramspec.draft.sizing.LossBudget`).
        request_weight: positions of a request's own evidence that weigh as much as the pooled
            estimate it starts from (:mod:`ngramspec.draft.acceptance`).
        calibration_weight: drafts of a request that weigh as much as the pool's predictions in
            its calibration of them (:mod:`ngramspec.draft.acceptance`; 0: no calibration).
        pool_prior_weight: positions the pooled estimate's prior weighs.
        pool_window: pooled positions per bucket past which the pool's counts halve, so it
            follows a workload that changes.
    """

    # fuzzy re-alignment (ngramspec.draft.realign)
    fuzzy_window: int = 12
    fuzzy_context: int = 6
    fuzzy_ahead: int = 16
    fuzzy_below_n: int = 3
    # learned edits (ngramspec.draft.edits)
    edit_span: int = 8
    max_edits: int = 8
    # token trees (ngramspec.draft.tree) and exploring (ngramspec.draft.sessions)
    tree_cost_slack: float = 0.1
    explore_below: float = 2.0
    first_risk: float = 0.5
    # acceptance (ngramspec.draft.acceptance)
    request_weight: float = 4.0
    pool_prior_weight: float = 2.0
    pool_window: float = 4096.0
    calibration_weight: float = 4.0

    def __post_init__(self) -> None:
        """Numbers of their declared types, each at least 1, or 0 where 0 turns a rule off."""
        least = {f.name: 0 if f.name in _MAY_BE_ZERO else 1 for f in fields(self)}
        check_numbers(self)
        for name, bound in least.items():
            if getattr(self, name) < bound:
                raise ValueError(f"{name} must be >= {bound}, got {getattr(self, name)!r}.")


# 0 turns these rules off
_MAY_BE_ZERO = ("fuzzy_below_n", "tree_cost_slack", "explore_below", "first_risk", "calibration_weight")


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
        acceptance_memory: decay, per declined or unverified draft, of the request's evidence for
            that match length, so it drifts back to the prior and tries again (the pool does not
            fade). 0.97, not 0.9: halfway back after ~23 declines, not ~7, so a request that does
            not copy retries a third as often (eval/results/acceptance_memory).
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
            fix applied throughout); an edit the target refuses is forgotten. Opt-in, in
            generate() and the vLLM drafter alike: replay of the 220 greedy traces moves -0.1% to
            +0.1% (their edits rarely recur); a rename repeated through a text needs 27 verify
            passes instead of 119.
        max_loss: None (the default): no loss bound. A share such as 0.02: the most a request
            may lose to drafts the target refuses, as a share of its plain steps: with payoff
            sizing, a draft is cut to what the request can afford to lose were all of it
            refused, so its forwards cost at most (1 + max_loss) x its tokens +
            ``draft_tuning.first_risk`` plain steps by the cost model, whatever it copies
            (:class:`~ngramspec.draft.sizing.LossBudget`). Off by default: on 12 long-prompt
            summaries (1.2-2.4k tokens, 2-core CPU) 0.02 gave 1.12-1.14x plain against
            1.17-1.18x without it, with no better worst item: after a refused draft, a request
            at 2.4k tokens of context waits ~15 plain steps before a 1-token draft (0.33 plain
            steps there) is affordable again, while its text goes on copying.
        self_draft_layers: self-speculation: where the n-gram index has no match at all, draft
            greedily with the target's own first ``self_draft_layers`` decoder layers (sharing its
            weights and KV cache; 0: off). generate() only, greedy only (a sampling request
            and batches do not self-draft), a plain dynamic cache only. Off by default: on the
            default model the first 24 of 30 layers agree with the full model's greedy token on
            0.33 of positions (0.31 where the n-gram copy breaks) at 0.8 of a full step's cost, the
            first 28 on 0.47 at 0.92, so it loses at every depth on the 2-core CPU (expected
            0.6-0.8x of plain greedy; ``python -m eval selfspec``, eval/results/selfspec.md).
        self_draft_tokens: the longest shallow draft (one shallow forward per token). With
            ``payoff_sizing``, the one sizing rule picks its length from the shallow tokens'
            measured agreement and a shallow forward's measured cost, and drafts nothing where a
            plain step pays more (:class:`~ngramspec.hf.shallow.ShallowEvidence`).
        self_draft_only: self-speculation alone: the n-gram drafts are not used (to measure it
            against n-gram drafting and both combined).
        cost_tuning: how the online cost model (``verify_cost`` None) learns from timings:
            :class:`~ngramspec.cost.costmodel.CostModelTuning`, its settings named
            ``cost_tuning.window`` and so on in settings text.
        draft_tuning: the drafting engine's finer rules (fuzzy re-alignment's reach, edits,
            tree slack, acceptance weights, exploring): :class:`DraftTuning`, its settings
            named ``draft_tuning.fuzzy_window`` and so on in settings text.
    """

    min_n: int = 1
    max_n: int = 6
    max_draft_tokens: int = 24
    match: str = "recent"
    payoff_sizing: bool = True
    verify_cost: tuple | None = None
    acceptance_prior: float = 0.5
    acceptance_memory: float = 0.97
    copy_cursor: bool = True
    fuzzy_resync: bool = True
    tree_branches: int = 1
    max_tree_tokens: int = 32
    history_tokens: int = 0
    edit_recurrence: bool = False
    max_loss: float | None = None
    self_draft_layers: int = 0
    self_draft_tokens: int = 4
    self_draft_only: bool = False
    # --- Tuning that once lived in module constants (issue 40); defaults as those were ---
    cost_tuning: CostModelTuning = CostModelTuning()
    draft_tuning: DraftTuning = DraftTuning()

    def __post_init__(self) -> None:
        for f in fields(self):
            value, kind = getattr(self, f.name), _type_name(f.type)
            if kind in TYPE_CHECKS and not TYPE_CHECKS[kind][0](value):
                raise SettingError(f"{f.name} must be {TYPE_CHECKS[kind][1]}, got {value!r}.")
            if is_dataclass(f.default) and not isinstance(value, type(f.default)):  # a sub-config
                raise SettingError(f"{f.name} must be a {type(f.default).__name__}, got {value!r}.")
        if self.min_n < 1:
            raise SettingError(f"min_n must be >= 1 (got {self.min_n}): an n-gram has at least one token.")
        if self.max_n < self.min_n:
            raise SettingError(
                f"max_n ({self.max_n}) must be >= min_n ({self.min_n}); set max_n to at least min_n."
            )
        if self.max_n > 64:
            raise SettingError(f"max_n must be <= 64 (got {self.max_n}); longer keys only add lookup cost.")
        if self.max_draft_tokens < 1:
            raise SettingError(
                f"max_draft_tokens must be >= 1 (got {self.max_draft_tokens}); to decode without "
                "speculation, call generate() without ngram_speculator."
            )
        if self.tree_branches < 1:
            raise SettingError(f"tree_branches must be >= 1 (got {self.tree_branches}); 1 drafts a plain chain.")
        if self.max_tree_tokens < self.max_draft_tokens:
            raise SettingError(
                f"max_tree_tokens ({self.max_tree_tokens}) must be >= max_draft_tokens ({self.max_draft_tokens})."
            )
        if self.history_tokens < 0:
            raise SettingError(f"history_tokens must be >= 0 (got {self.history_tokens}); 0 turns history off.")
        if self.self_draft_layers < 0:
            raise SettingError(f"self_draft_layers must be >= 0 (got {self.self_draft_layers}); 0 turns it off.")
        if self.self_draft_tokens < 1:
            raise SettingError(f"self_draft_tokens must be >= 1 (got {self.self_draft_tokens}).")
        if self.self_draft_only and not self.self_draft_layers:
            raise SettingError("self_draft_only needs self_draft_layers > 0 (the shallow drafter it keeps).")
        if self.match not in MATCH_POLICIES:
            raise SettingError(f"match must be one of {MATCH_POLICIES}, got {self.match!r}.")
        if not 0.0 < self.acceptance_prior < 1.0:
            raise SettingError(f"acceptance_prior must be in (0, 1), got {self.acceptance_prior}.")
        if not 0.0 <= self.acceptance_memory <= 1.0:
            raise SettingError(f"acceptance_memory must be in [0, 1], got {self.acceptance_memory}.")
        if self.max_loss is not None and not 0.0 <= self.max_loss < float("inf"):
            raise SettingError(f"max_loss must be a share >= 0, or None (no bound), got {self.max_loss}.")
        if self.verify_cost is not None:  # validated (its messages), kept as normalised points
            try:
                object.__setattr__(self, "verify_cost", CostCurve(self.verify_cost).points)
            except ValueError as err:
                raise SettingError(str(err)) from None

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Each setting's first sentence from its Attributes section (for --help texts), a
        sub-config's settings as ``group.name``."""
        return {name: _first_sentence(owner, name.rpartition(".")[2]) for name, (owner, _) in setting_fields().items()}


def _first_sentence(owner: type, name: str) -> str:
    """The first sentence of ``name``'s entry in the Attributes section of ``owner``'s docstring,
    without Sphinx markup."""
    text, reading = "", False
    for line in (owner.__doc__ or "").partition("Attributes:")[2].splitlines():
        head, sep, rest = line.strip().partition(": ")
        if line.startswith(" " * 8) and not line.startswith(" " * 9) and sep and head.isidentifier():
            reading, text = head == name, rest if head == name else text
        elif reading and line.strip():
            text += " " + line.strip()
    text = re.sub(r"``([^`]+)``", r"\1", re.sub(r":\w+:`~?([^`]+)`", r"\1", text))
    return text.split(". ")[0].rstrip(".") + "."


# --- The one settings parser ------------------------------------------------------------
# A field's annotation names its type (text, under ``from __future__ import annotations``);
# each type named here has its check (keyword arguments) and its reader (text), so a new
# field of a new type fails at import (below) rather than parsing as something else.


def _type_name(annotation) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


TYPE_CHECKS = {  # type name -> (accepts a Python value, what it takes)
    "int": (_is_int, "an int"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "str": (lambda v: isinstance(v, str), "text"),
    "float | None": (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                     "a number or None"),
}


def _read_bool(text: str) -> bool:
    word = text.lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _read_curve(text: str) -> tuple | None:
    return None if text.lower() == "auto" else CostCurve.parse(text).points


READERS = {  # type name -> (text -> value, raising ValueError; what the text must be)
    "int": (int, "an integer"),
    "float": (float, "a number"),
    "bool": (_read_bool, "true or false"),
    "str": (str, "text"),
    "float | None": (lambda text: None if text.lower() in ("none", "off") else float(text), "off or a number"),
    "tuple | None": (_read_curve, "auto or a cost curve, q:cost pairs from q=1 with q increasing and costs "
                                  "positive (1:1.0,8:1.5)"),
}


def setting_fields() -> dict[str, tuple[type, object]]:
    """Every setting by name -> (the dataclass that declares it, its field): SpeculatorConfig's
    own fields, and a sub-config's (a field whose default is a dataclass) as ``group.name``."""
    found = {}
    for f in fields(SpeculatorConfig):
        if is_dataclass(f.default):
            found.update({f"{f.name}.{g.name}": (type(f.default), g) for g in fields(f.default)})
        else:
            found[f.name] = (SpeculatorConfig, f)
    return found


def _unknown(name: str) -> SettingError:
    return SettingError(f"unknown speculator setting {name!r}; known: {', '.join(setting_fields())}")


def split_settings(text: str) -> dict[str, str]:
    """``"min_n=1, max_n=4"`` -> ``{"min_n": "1", "max_n": "4"}`` (values still text). A part
    without ``=`` continues the previous value, so a value may hold commas:
    ``verify_cost=1:1.0,8:1.5``. A name given twice: the last one holds."""
    values: dict[str, str] = {}
    name = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" in part:
            name, value = (s.strip() for s in part.split("=", 1))
            values[name] = value
        elif name is not None:
            values[name] += "," + part
        else:
            raise SettingError(f"expected name=value in {text!r}")
    return values


def read_setting(name: str, text: str):
    """The value of setting ``name`` written as ``text``, read by the type its field declares."""
    found = setting_fields().get(name)
    if found is None:
        raise _unknown(name)
    reader, what = READERS[_type_name(found[1].type)]
    try:
        return reader(text.strip())
    except ValueError:
        raise SettingError(f"{name} must be {what}, got {text!r}") from None


def read_settings(text: str) -> dict:
    """Settings text -> {name: value}, every value read by its field's type."""
    return {name: read_setting(name, value) for name, value in split_settings(text).items()}


def config_with(base: SpeculatorConfig, values: dict) -> SpeculatorConfig:
    """``base`` with ``values`` ({setting name: value}, sub-config settings as ``group.name`` or
    a whole sub-config by its group's name) in place, validated: every route ends here."""
    known = setting_fields()
    groups = {name.partition(".")[0] for name in known if "." in name}
    for name in values:
        if name not in known and name not in groups:
            raise _unknown(name)
    plain = {name: value for name, value in values.items() if "." not in name}
    for group in groups:
        inner = {name.partition(".")[2]: value for name, value in values.items() if name.startswith(group + ".")}
        if inner:
            try:
                plain[group] = replace(plain.get(group, getattr(base, group)), **inner)
            except (TypeError, ValueError) as err:
                raise SettingError(f"{group}.{err}") from None
    return replace(base, **plain)


def parse_config(text: str, base: SpeculatorConfig | None = None) -> SpeculatorConfig:
    """The settings parser: ``"min_n=1,verify_cost=1:1.0,8:1.5"`` -> ``base`` (default: the
    defaults) with those settings, each read by its field's type, validated. A bad name or value
    is a :class:`SettingError` that names it (an unknown name: with the known ones)."""
    return config_with(base or SpeculatorConfig(), read_settings(text))


for _name, (_owner, _field) in setting_fields().items():  # every setting can be read from text
    assert _type_name(_field.type) in READERS, f"{_owner.__name__}.{_field.name}: no reader for {_field.type!r}"

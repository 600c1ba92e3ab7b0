"""Protect the user's text from a model that drifts: stop a degenerate chunk early, and keep a
chunk as it was when its rewrite cannot be trusted.

    stop = LoopStop(source_ids, prompt_length)          # a transformers StoppingCriteria
    model.generate(ids, max_new_tokens=length_bound(len(source_ids)), stopping_criteria=[stop])
    reason = drift_reason(source, rewrite, "markdown", stopped="loop" if stop.fired else "")
    text = source if reason else rewrite

A small model asked to fix typos sometimes answers with something else: a chat reply, invented
code, one line repeated until the token limit. Such output is cheap to draft (it copies itself),
so it looks fast exactly when it is worst. Three rules, each written once here:

* **Loop stop.** Generation stops once the output ends in a periodic stretch (a span of up to
  ``max_period`` tokens repeated back to back) longer than ``loop_allowance(source)``: twice the
  longest such stretch of the source, and never under ``min_loop_tokens``. A table rule or a
  run of ``=`` the source has is copied freely; a span the source never repeats cannot loop.
* **Length bound.** A rewrite of ``n`` source tokens may take ``length_bound(n)`` new tokens.
  Reaching it means the rewrite is incomplete or runaway: the chunk is kept as it was.
* **Drift.** A finished rewrite replaces its source only when its similarity to the source is
  at least the floor (0.8 for an instruction that asks for corrections: typos, spelling,
  grammar, punctuation; 0.5 for any other, which asks for rewording), its length is within
  ``max_growth``, and its structure survived:
  Markdown front matter, heading levels, list items and code fences; code that parsed as Python
  still parses.

How often each rule would stop or discard a person's edit (the shared rewriting and
code-editing sets' references against their sources; ``python -m eval realdocs --bounds``,
``eval/results/realdocs/bounds.md``): the loop stop never; the length bound at most 0.2% of
corrections and rewrites, 5-6% of code edits that add code; the similarity floor 1-6% of
corrections (humanevalfix, jfleg) at 0.8, of simplifications (asset) 7.8% at 0.5, sentence by
sentence; in a document none. The correction floor is set by what the default model does on
real documents asked to fix typos (``eval/results/realdocs/suite.md``): its rewrites between
0.5 and 0.8 were garbage.

Every number the rules use is a field of :class:`~ngramspec.app.settings.JobSettings` (why each
is what it is: its docstring); each function takes the settings, the defaults when left out.
"""

from __future__ import annotations

import ast
import math
import re

import numpy as np
import torch
from rapidfuzz import fuzz
from transformers import StoppingCriteria

from .settings import JobSettings

DEFAULTS = JobSettings()  # what a guard function uses when it is given no settings


def similarity(source: str, text: str) -> float:
    """How much of ``source`` a rewrite kept, in [0, 1]: rapidfuzz's Indel ratio (1 - edits /
    total length), 1.0 for identical text."""
    return fuzz.ratio(source, text) / 100


def longest_periodic_stretch(tokens, max_period: int = DEFAULTS.max_period) -> int:
    """Length of the longest stretch of ``tokens`` that repeats a span of at most ``max_period``
    tokens at least twice back to back (0 if none). Example: ``[7, 1, 2, 1, 2, 1, 2, 9]`` has
    the stretch ``1 2 1 2 1 2`` (period 2): 6."""
    x = np.asarray(tokens, dtype=np.int64)
    best = 0
    for period in range(1, min(max_period, len(x) // 2) + 1):
        same = np.concatenate(([False], x[period:] == x[:-period], [False]))  # x[i] == x[i - period]
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        if len(edges):
            run = int((edges[1::2] - edges[::2]).max())  # longest run of matches
            if run >= period:
                best = max(best, run + period)
    return best


def loop_allowance(source_tokens, settings: JobSettings = DEFAULTS) -> int:
    """Longest periodic stretch an output may have before it counts as a loop."""
    return max(settings.min_loop_tokens, 2 * longest_periodic_stretch(source_tokens, settings.max_period))


def length_bound(source_tokens: int, settings: JobSettings = DEFAULTS) -> int:
    """Most new tokens a rewrite of ``source_tokens`` tokens may take: past it, the rewrite
    would be too long to keep anyway (``settings.growth``: max_growth, or unguarded_growth
    with the drift guard off)."""
    return math.ceil(settings.growth * source_tokens) + settings.length_slack


class LoopStop(StoppingCriteria):
    """Stops a batch-of-one generation once its new tokens end in a periodic stretch longer
    than ``loop_allowance(source_tokens, settings)``; ``fired`` tells afterwards. Updates in O(max_period)
    per new token (one read of the new tokens per call), so it can be asked after every
    token the speculative loop emits."""

    def __init__(self, source_tokens, prompt_length: int, settings: JobSettings = DEFAULTS):
        self.allowance = loop_allowance(source_tokens, settings)
        self.max_period = settings.max_period
        self.prompt_length = prompt_length
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []  # new tokens seen so far
        self.runs = [0] * (self.max_period + 1)  # runs[p]: trailing tokens equal to the one p before
        self.fired = False

    def _push(self, token: int) -> bool:
        tokens, runs = self.tokens, self.runs
        tokens.append(token)
        n = len(tokens)
        for period in range(1, min(self.max_period, n - 1) + 1):
            runs[period] = runs[period] + 1 if tokens[n - 1 - period] == token else 0
            if runs[period] >= period and runs[period] + period > self.allowance:
                return True
        return False

    def __call__(self, input_ids: torch.LongTensor, scores=None, **kwargs) -> torch.BoolTensor:
        if input_ids.shape[0] != 1:
            raise ValueError("LoopStop watches one sequence; give it a batch of one")
        seen = self.prompt_length + len(self.tokens)
        if input_ids.shape[1] < seen:  # a new generation with the same criterion
            self.reset()
            seen = self.prompt_length
        for token in input_ids[0, seen:].tolist():
            self.fired = self._push(token) or self.fired
        return torch.tensor([self.fired], device=input_ids.device)


# -- drift -------------------------------------------------------------------------------------
_FRONT_MATTER = re.compile(r"\A---\n.*?\n---(\n|\Z)", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})\s", re.MULTILINE)
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]", re.MULTILINE)
_FENCE = re.compile(r"^[ \t]*(```|~~~)", re.MULTILINE)


def markdown_outline(text: str) -> tuple:
    """What a Markdown rewrite must keep: front matter present, heading levels in order, the
    number of list items and of fence lines."""
    return (bool(_FRONT_MATTER.match(text)), [len(h) for h in _HEADING.findall(text)],
            len(_LIST_ITEM.findall(text)), len(_FENCE.findall(text)))


def parses_as_python(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def drift_reason(source: str, text: str, kind: str, settings: JobSettings = DEFAULTS, stopped: str = "",
                 instruction: str = "") -> str:
    """Why ``text`` must not replace ``source`` (a chunk of a document of ``kind``), or "" when
    it may. ``stopped``: "loop" or "length" when generation was cut by the loop stop or the
    length bound. ``instruction`` sets the similarity floor (``settings.floor``: stricter for
    corrections than for rewording). ``settings.similarity_floor`` 0 turns the whole guard off."""
    if not settings.guarded:
        return ""
    if stopped == "loop":
        return "it repeated itself (generation stopped early)"
    if stopped == "length":
        return "it ran past the length bound (generation stopped)"
    max_growth, floor = settings.max_growth, settings.floor(instruction)
    if len(text) > max_growth * len(source) + settings.growth_slack_chars:
        return f"{len(text) / len(source):.2f}x as long as its source (over --max-growth {max_growth})"
    score = similarity(source, text)
    if score < floor:
        return f"similarity {score:.3f} < {floor}"
    if kind == "markdown":
        before, after = markdown_outline(source), markdown_outline(text)
        for name, old, new in zip(("front matter", "headings", "list items", "code fences"), before, after):
            if old != new:
                return f"its {name} changed"
    if kind == "code" and parses_as_python(source) and not parses_as_python(text):
        return "it no longer parses as Python"
    return ""

"""The document job's settings: every number that tunes how a document is chunked, rewritten,
summarized and guarded, in one frozen, validated dataclass.

    settings = JobSettings(similarity_floor=0.5, chunk_tokens=512)   # a bad value raises here
    settings.floor("Fix any typos.")                                 # 0.5 (None: 0.8 here, 0.5 to simplify)
    job = DocumentJob(model, tokenizer, speculator, settings=settings)

:class:`~ngramspec.app.documents.DocumentJob` holds one and passes it to the guard
(``guard.py``); the CLI's ``--chunk-tokens``, ``--keep-drifted`` and ``--max-growth`` take
their defaults from :class:`JobSettings` and build one from what they were given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

# The summarize command's default instruction (the CLI's --instruction default reads it here).
SUMMARIZE_INSTRUCTION = "Summarize the following text in a few sentences."


@dataclass(frozen=True)
class JobSettings:
    """How a :class:`~ngramspec.app.documents.DocumentJob` chunks, generates and guards.

    Attributes:
        chunk_tokens: Largest chunk, in tokens (``--chunk-tokens``). DocumentJob lowers it
            further for a short context: a chunk, its prompt and its output must fit.
        min_chunk_tokens: Smallest chunk allowed: a chunk of a sentence or two gives the model
            too little context.
        summary_tokens: New tokens per chunk summary when max_new_tokens is not given.
        context_chars: How much of the previous rewritten chunk (its last characters) is shown
            as context when rewriting the next.
        similarity_floor: The drift guard's floor (``--keep-drifted``): a rewrite less similar
            to its chunk is discarded, 0 turns the guard off. None (the default): the floor
            the instruction calls for, correction_floor or rewording_floor (:meth:`floor`).
        correction_floor: The floor for an instruction that asks for corrections only (typos,
            spelling, grammar, punctuation, proofreading). Every rewrite of the default model
            below 0.8 on real documents was garbage (0 typos fixed, dozens of words changed;
            accepted at 0.72-0.79 by a floor of 0.5), while people's corrections (jfleg,
            humanevalfix) stay above it in 95-99% of pairs, and every one in a document.
        rewording_floor: The floor for any other instruction (simplify, clarify, revise,
            restyle): it asks for rewording, and people's simplifications fall below 0.8 in
            57% of sentences (asset) and revisions in 16% (iterater_human); in a document
            (chunks of several sentences) every one of them stays above 0.5.
        max_growth: Longest rewrite kept, relative to its source (``--max-growth``; characters,
            beyond growth_slack_chars). Also the growth of the length bound with the guard on.
        growth_slack_chars: Characters a rewrite may gain beyond max_growth: a short chunk may
            gain a few words without counting as drift.
        length_slack: New tokens a rewrite may take beyond growth x its source's tokens (the
            length bound).
        unguarded_growth: The length bound's growth with the drift guard off (the budget was
            2x + slack before the guard existed).
        max_period: Longest repeated span (tokens) the loop stop looks for.
        min_loop_tokens: A periodic stretch shorter than this never stops generation.
        assumed_context_tokens: The context length assumed for a model whose config does not
            state one (``max_position_embeddings``).
        prompt_tokens: Context tokens kept for a chunk's prompt (instruction, the previous
            chunk's tail) when chunks are capped to fit the context: a third of the rest each
            for the chunk, its copy in the prompt and its rewrite.
    """

    chunk_tokens: int = 768
    min_chunk_tokens: int = 32
    summary_tokens: int = 256
    context_chars: int = 300
    similarity_floor: float | None = None
    correction_floor: float = 0.8
    rewording_floor: float = 0.5
    max_growth: float = 1.3
    growth_slack_chars: int = 40
    length_slack: int = 64
    unguarded_growth: float = 2.0
    max_period: int = 32
    min_loop_tokens: int = 64
    assumed_context_tokens: int = 8192
    prompt_tokens: int = 256

    def __post_init__(self):
        for f in fields(self):
            value, whole = getattr(self, f.name), f.type == "int"
            if value is None and f.name == "similarity_floor":
                continue  # by the instruction
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                raise TypeError(f"JobSettings.{f.name} must be {'an int' if whole else 'a number'}, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"JobSettings.{f.name} must be a finite number, got {value!r}")
        positive = ("min_chunk_tokens", "summary_tokens", "max_period", "assumed_context_tokens")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"JobSettings.{name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("context_chars", "growth_slack_chars", "length_slack", "min_loop_tokens", "prompt_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"JobSettings.{name} must be at least 0, got {getattr(self, name)!r}")
        if self.chunk_tokens < self.min_chunk_tokens:
            raise ValueError(f"JobSettings.chunk_tokens must be at least {self.min_chunk_tokens} "
                             f"(min_chunk_tokens), got {self.chunk_tokens!r}")
        for name in ("similarity_floor", "correction_floor", "rewording_floor"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"JobSettings.{name} takes a similarity between 0 and 1 (0 turns the guard "
                                 f"off), got {value!r}")
        for name in ("max_growth", "unguarded_growth"):
            if not getattr(self, name) >= 1.0:
                raise ValueError(f"JobSettings.{name} takes a length ratio of at least 1, got {getattr(self, name)!r}")

    @property
    def guarded(self) -> bool:
        """Whether the drift guard is on (a similarity floor other than 0)."""
        return self.similarity_floor != 0

    def floor(self, instruction: str) -> float:
        """The similarity floor for ``instruction``: similarity_floor where given, else
        correction_floor for an instruction that asks for corrections only, rewording_floor
        for any other."""
        if self.similarity_floor is not None:
            return self.similarity_floor
        return self.correction_floor if asks_for_corrections(instruction) else self.rewording_floor

    @property
    def growth(self) -> float:
        """The length bound's growth: max_growth with the drift guard on, else unguarded_growth."""
        return self.max_growth if self.guarded else self.unguarded_growth


# Words of an instruction that asks for corrections, not rewording ("Fix any spelling mistakes",
# "Correct the grammar", "Proofread"). Any other instruction asks for rewording: simplify,
# clarify, revise, restyle, and fixes of fluency or style.
_CORRECTIONS = re.compile(r"\b(typos?|spell\w*|misspell\w*|grammar|grammatical\w*|punctuation|capitali[sz]\w*|"
                          r"proofread\w*)\b", re.IGNORECASE)


def asks_for_corrections(instruction: str) -> bool:
    """Whether ``instruction`` asks for corrections (typos, spelling, grammar, punctuation)."""
    return bool(_CORRECTIONS.search(instruction or ""))


__all__ = ["SUMMARIZE_INSTRUCTION", "JobSettings"]

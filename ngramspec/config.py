"""Every knob of the speculator, in one frozen dataclass validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, fields

MATCH_POLICIES = ("recent", "earliest")


@dataclass(frozen=True)
class SpeculatorConfig:
    """Settings of an :class:`~ngramspec.NgramSpeculator`.

    Attributes:
        min_n: shortest suffix n-gram that may trigger a draft. 1 lets a single repeated token
            propose a continuation; raise it to draft only on stronger evidence.
        max_n: longest suffix n-gram looked up. The longest match in ``[min_n, max_n]`` wins,
            because a longer shared context predicts the continuation better.
        max_draft_tokens: most tokens proposed per step (the verify pass is this plus one).
        match: which earlier occurrence of the matched n-gram to copy from: ``"recent"`` (the
            latest one; the model usually continues the text it copied last) or ``"earliest"``
            (the first one, as vLLM's proposer does).
        draft_tokens_per_match_token: draft length grows with the evidence: a match of n tokens
            proposes at most ``n * draft_tokens_per_match_token`` tokens (capped by
            ``max_draft_tokens``), so a lone 1-token match risks little verification work.
            0 turns scaling off (always ``max_draft_tokens``).
    """

    min_n: int = 1
    max_n: int = 4
    max_draft_tokens: int = 8
    match: str = "recent"
    draft_tokens_per_match_token: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"SpeculatorConfig.{f.name} must be an int, got {value!r}.")
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
        if self.match not in MATCH_POLICIES:
            raise ValueError(f"match must be one of {MATCH_POLICIES}, got {self.match!r}.")
        if self.draft_tokens_per_match_token < 0:
            raise ValueError(
                "draft_tokens_per_match_token must be >= 0 (0 disables scaling), got "
                f"{self.draft_tokens_per_match_token}."
            )

    def draft_limit(self, match_len: int) -> int:
        """Most tokens to draft after a suffix match of ``match_len`` tokens."""
        if self.draft_tokens_per_match_token == 0:
            return self.max_draft_tokens
        return min(self.max_draft_tokens, match_len * self.draft_tokens_per_match_token)

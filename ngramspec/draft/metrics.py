"""Per-call decoding statistics: what a speculative run did and what it cost."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """Counters of one generate call (batch of one).

    ``target_forwards`` counts every forward pass of the target model, prefill included, so
    plain greedy decoding has ``mat == 1.0`` and ``mat`` is directly the speed-up in forwards.
    ``drafted_at[j]``/``accepted_at[j]``: how often draft position j (0-based) was proposed and
    accepted; their ratio is the acceptance by position.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    steps_with_draft: int = 0
    # Steps where a match existed but drafting was judged not to pay (payoff sizing, or the
    # batch rule): plain decoding steps chosen on purpose, i.e. speculation switched off.
    declined_steps: int = 0
    # Plain steps taken because the drafting kernels were still compiling (a fresh install's first
    # requests, ngramspec.draft.compiling): no draft was possible, none was declined.
    compiling_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)  # per decode forward (prefill excluded)
    verified_per_step: list[int] = field(default_factory=list)  # draft tokens verified per forward
    # Self-speculation (SpeculatorConfig.self_draft_layers): shallow draft tokens, and how many
    # of them the target accepted (also counted in drafted_tokens / accepted_tokens).
    self_drafted_tokens: int = 0
    self_accepted_tokens: int = 0
    drafter_seconds: float = 0.0
    prefill_seconds: float = 0.0  # the prompt's forward and first token: the same for every method
    wall_seconds: float = 0.0
    stop_reason: str = ""

    def record_prefill(self, seconds: float = 0.0) -> None:
        self.target_forwards += 1
        self.prefill_seconds = seconds

    def record_step(self, drafted: int, accepted: int, declined: bool = False) -> None:
        self.target_forwards += 1
        self.declined_steps += declined
        self.accepted_per_step.append(accepted)
        self.verified_per_step.append(drafted)
        if drafted == 0:
            return
        self.steps_with_draft += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if len(self.drafted_at) < drafted:
            grow = drafted - len(self.drafted_at)
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for j in range(drafted):
            self.drafted_at[j] += 1
        for j in range(accepted):
            self.accepted_at[j] += 1

    @property
    def mat(self) -> float:
        """Mean tokens emitted per target forward (1.0 for plain decoding)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def drafter_us_per_step(self) -> float:
        return 1e6 * self.drafter_seconds / self.target_forwards if self.target_forwards else 0.0

    @classmethod
    def combine(cls, rows: list[DecodeStats]) -> DecodeStats:
        """One call's totals over its rows: counters summed (so ``mat`` is tokens per row
        forward, 1.0 for plain decoding), per-position counts added, per-step lists joined,
        the wall time of the call; ``stop_reason`` is the rows' common reason, or "mixed"."""
        total = cls()
        for row in rows:
            for name in ("prompt_tokens", "new_tokens", "target_forwards", "steps_with_draft", "declined_steps",
                         "compiling_steps", "drafted_tokens", "accepted_tokens", "self_drafted_tokens",
                         "self_accepted_tokens", "drafter_seconds"):
                setattr(total, name, getattr(total, name) + getattr(row, name))
            for name in ("drafted_at", "accepted_at"):
                mine, theirs = getattr(total, name), getattr(row, name)
                mine.extend([0] * (len(theirs) - len(mine)))
                for j, count in enumerate(theirs):
                    mine[j] += count
            total.accepted_per_step += row.accepted_per_step
            total.verified_per_step += row.verified_per_step
        total.wall_seconds = max((row.wall_seconds for row in rows), default=0.0)
        total.prefill_seconds = max((row.prefill_seconds for row in rows), default=0.0)
        reasons = {row.stop_reason for row in rows}
        total.stop_reason = reasons.pop() if len(reasons) == 1 else "mixed"
        return total

    def as_dict(self) -> dict:
        """Every counter (``dataclasses.asdict``, so a new field is never left out) plus the
        derived rates, rounded as stored JSON and the harness reports have always had them."""
        record = dataclasses.asdict(self)
        record["wall_seconds"] = round(self.wall_seconds, 4)
        record.update(
            mat=round(self.mat, 4),
            acceptance_rate=round(self.acceptance_rate, 4),
            acceptance_by_position=[round(x, 4) for x in self.acceptance_by_position],
            drafter_us_per_step=round(self.drafter_us_per_step, 2),
            tokens_per_second=round(self.tokens_per_second, 2),
        )
        return record

    def __str__(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.target_forwards} forwards (MAT {self.mat:.2f}), "
            f"{self.accepted_tokens}/{self.drafted_tokens} drafted accepted, "
            f"{self.tokens_per_second:.1f} tok/s, drafter {self.drafter_us_per_step:.1f} us/step"
        )

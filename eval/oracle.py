"""Upper bounds for exact lookup drafting, in replay: ``python -m eval replay T --methods oracle,truth-sized``.

The oracle knows the whole greedy output. At every step it may copy from ANY earlier place in
the text whose preceding token equals the last emitted one (the weakest suffix match, n = 1),
it knows exactly how many copied tokens the target will accept, and it chooses every step's
draft length by dynamic programming to minimise the total verify cost. No drafter that copies
earlier text and is verified exactly can need less verify cost on the same trace and curve.

Worked example (prompt "a b c d", output "b c x"): after the prefill emitted "b", the last
token "b" occurred at position 1, followed by "c d"; the output continues "c x", so the copy
holds for 1 token: one step verifies [b, c] and emits "c" plus the target's "x".

``truth-sized[:settings]`` splits the oracle's lead over ngramspec in two: ngramspec's own
drafts (same sources, same settings), each cut to exactly the tokens the target accepts, so no
verified position is wasted and none that would be accepted is left out. The gap from ngramspec
to it is what draft sizing loses to not knowing acceptance in advance; the gap from it to the
oracle is what choosing among earlier copies loses. With history off it never beats the oracle
(each of its drafts is one the oracle may choose).
"""

from __future__ import annotations

import numpy as np

from ngramspec.draft.config import SpeculatorConfig
from ngramspec.draft.walk import accepted_length

# The oracle drafts as far as ngramspec's default may (a bound must not draft less).
ORACLE_MAX_DRAFT = SpeculatorConfig().max_draft_tokens


def copy_lengths(prompt_ids, output_ids, max_draft: int) -> np.ndarray:
    """L[p] for p in 0..N-1: the longest run of output[p:] (at most ``max_draft``) that some
    earlier place of the text, preceded by the last token before p, also holds."""
    prompt, output = list(map(int, prompt_ids)), list(map(int, output_ids))
    text = prompt + output
    where: dict[int, list[int]] = {}  # token -> positions j such that text[j - 1] == token
    for j in range(1, len(prompt)):
        where.setdefault(text[j - 1], []).append(j)
    lengths = np.zeros(len(output), dtype=np.int64)
    for p in range(len(output)):
        g = len(prompt) + p  # text position of output[p]; text[:g] exists when it is decided
        if g >= 1:
            for j in where.get(text[g - 1], ()):
                # Past text[g - 1] the copy runs into the draft itself (a period of g - j
                # tokens); text holds the whole output, so comparing with it models exactly that.
                n = 0
                limit = min(max_draft, len(output) - p)
                while n < limit and text[j + n] == output[p + n]:
                    n += 1
                lengths[p] = max(lengths[p], n)
        if g >= 1:
            where.setdefault(text[g - 1], []).append(g)  # text[g] follows text[g - 1] from now on
    return lengths


def oracle_replay(prompt_ids, output_ids, cost, max_draft: int = ORACLE_MAX_DRAFT) -> tuple[int, int, float]:
    """(new tokens, target forwards, total verify cost) of the cheapest exact schedule."""
    n = len(output_ids)
    if n == 0:
        return 0, 0, 0.0
    lengths = copy_lengths(prompt_ids, output_ids, max_draft)
    best = np.zeros(n + 1)  # best[p]: least cost to emit output[p:] (output[0] comes from the prefill)
    steps = np.zeros(n + 1, dtype=np.int64)
    for p in range(n - 1, 0, -1):
        options = [(cost(k + 1) + best[p + k + 1], k) for k in range(0, min(int(lengths[p]), n - p - 1) + 1)]
        best[p], k = min(options)
        steps[p] = 1 + steps[p + k + 1]
    return n, 1 + int(steps[1]), 1.0 + float(best[1])


def truth_sized_replay(session, output_ids, cost) -> tuple[int, int, float]:
    """(new tokens, target forwards, total verify cost) when ``session`` (an ngramspec session
    started on the trace's prompt) drafts as usual but each draft is cut to what the target
    accepts (the replay loop of :func:`ngramspec.draft.replay.replay`, with the truth sizing)."""
    output = np.asarray(output_ids, dtype=np.int32)
    n = len(output)
    if n == 0:
        return 0, 0, 0.0
    session.extend(output[:1])  # the prefill's token
    pos, forwards, total = 1, 1, 1.0
    while pos < n:
        draft = session.propose(max_tokens=n - pos - 1, sized=False, tree=False)
        kept = accepted_length(draft.tokens, None, output[pos : pos + len(draft)])
        total += cost(kept + 1)
        forwards += 1
        session.extend(output[pos : pos + kept + 1], verified=kept)
        pos += kept + 1
    session.finish()
    return n, forwards, total

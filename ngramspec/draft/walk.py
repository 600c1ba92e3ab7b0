"""The verify rule's walk, without tensors: which draft tokens a continuation keeps.

A step feeds [last, d1..dk] to the target and reads its choice at every block row (draft token
i sits at row i + 1). Walking from row 0, the choice at a row is emitted; if a draft token equal
to it follows the row, the walk moves to that token's row, else it stops. With a token tree,
``parents[i]`` is the draft index token i follows (-1: the last token) and the walk follows
whichever child carries the choice. :mod:`ngramspec.hf.verify` applies it to a forward's
logits; sessions and the trace replayer apply it to recorded tokens.
"""

from __future__ import annotations

from collections.abc import Callable


def follow(draft, parents, choice: Callable[[int, list[int]], int | None]) -> tuple[list[int], list[int]]:
    """Walk the draft along the target's choices (the module's rule).

    draft: k token ids; parents: None for a chain, else k parent indices (-1 = the last token).
    choice(row, emitted) -> the target's token at block row ``row``, given the tokens this
    step emitted so far (their number is the row's depth); None when unknown (a recorded
    continuation ran out), which ends the walk without emitting.
    Returns (emitted tokens, path of kept draft indices).
    """
    if parents is None:
        children = {(i - 1, int(token)): i for i, token in enumerate(draft)}
    else:
        children = {(int(parent), int(token)): i for i, (parent, token) in enumerate(zip(parents, draft))}
    emitted: list[int] = []
    path: list[int] = []
    node = -1  # -1: the last token (block row 0); draft index i sits at block row i + 1
    while True:
        token = choice(node + 1, emitted)
        if token is None:
            return emitted, path
        emitted.append(token)
        node = children.get((node, token), None)
        if node is None:
            return emitted, path
        path.append(node)


def accepted_length(draft, parents, continuation) -> int:
    """Draft tokens kept when the target continues with ``continuation`` (a recorded greedy
    output, or the tokens a step emitted): the deepest path whose tokens equal it."""
    n = len(continuation)
    if parents is None:  # a chain: the common prefix (the walk below, without its per-step dict)
        kept = 0
        while kept < len(draft) and kept < n and draft[kept] == continuation[kept]:
            kept += 1
        return kept

    def recorded(row: int, emitted: list[int]) -> int | None:
        return int(continuation[len(emitted)]) if len(emitted) < n else None

    return len(follow(draft, parents, recorded)[1])

"""Token trees (``tree_branches > 1``): other candidate continuations join the chain as branches
of a trie rooted at the last emitted token, verified in the same forward.

``tokens[i]`` follows ``tokens[parents[i]]`` (-1: the last emitted token); the chain comes first
(``parents = -1, 0, 1, ...``). A branch walks down the trie while its tokens are already there
and adds the rest as new nodes. Branches only take positions that cost at most a slack
(``draft_tuning.tree_cost_slack``, 10%) more than verifying the chain alone: on a GPU machine,
where verifying more positions costs almost nothing, many; on a small CPU, a few or none.

Worked example: chain ``[7 5 6]``, branch ``[7 9]``, room for 4 tokens: ``7`` is the chain's
first node, ``9`` becomes node 3 under it: tokens ``[7 5 6 9]``, parents ``[-1 0 1 0]``.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def tree_budget(costs, chain, max_tree_tokens, slack):
    """How many tokens the tree may hold: the chain's ``chain`` and as many more (up to
    ``max_tree_tokens``) as keep the forward within ``slack`` of the chain's cost
    (``costs[q]``: a forward over q tokens, q up to ``max(max_tree_tokens, chain) + 1``)."""
    budget = chain
    ceiling = costs[chain + 1] * (1 + slack)
    while budget < max_tree_tokens and costs[budget + 2] <= ceiling:
        budget += 1
    return budget


@njit(cache=True)
def add_branch(tokens, parents, count, branch, budget):
    """Merge ``branch`` (int32 tokens) into the trie ``tokens[:count]``/``parents[:count]``,
    adding nodes while fewer than ``budget``; returns the new count."""
    parent = -1
    for t in branch:
        child = -1
        for i in range(count):
            if parents[i] == parent and tokens[i] == t:
                child = i
                break
        if child >= 0:
            parent = child
            continue
        if count >= budget:
            break
        tokens[count], parents[count] = t, parent
        parent = count
        count += 1
    return count

"""The one sizing rule (ngramspec.draft.sizing): its worked example, its limits, optimality against
brute force, and the compiled kernel pinned to its plain-Python reference."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramspec.draft.sizing import _by_gain, draft_lengths

from reference_sizing import candidates_reference, draft_lengths_reference


def constant(rates, width):
    """Each row's acceptance the same at every position: (rows, width)."""
    return np.repeat(np.asarray(rates, dtype=np.float64)[:, None], width, axis=1)


def flattened_costs(rows, limits, cost):
    return np.array([cost(rows + m) for m in range(int(sum(limits)) + 1)], dtype=np.float64)


def test_worked_example_in_the_docstring():
    cost = lambda n: 1 + 0.1 * (n - 1)
    lengths, value = draft_lengths(constant([0.9, 0.5], 3), np.array([3, 2]), flattened_costs(2, [3, 2], cost), False)
    assert lengths.tolist() == [3, 1] and value == pytest.approx((2 + 0.9 + 0.81 + 0.729 + 0.5) / cost(6))


def test_a_busy_step_drafts_nothing_when_positions_cost_a_full_token():
    lengths, _ = draft_lengths(constant([0.6, 0.7, 0.5], 5), np.array([5, 5, 5]),
                               flattened_costs(3, [5, 5, 5], lambda n: 1.0 * n), False)
    assert lengths.tolist() == [0, 0, 0]


def test_padded_rows_share_one_length_cut_to_each_draft():
    costs = np.array([1.0, 1.1, 1.2, 1.3, 1.4])  # K = 0..4 per row, cheap positions
    lengths, _ = draft_lengths(constant([0.9, 0.9, 0.1], 4), np.array([4, 2, 0]), costs, True)
    assert lengths.tolist() == [4, 2, 0]
    lengths, _ = draft_lengths(constant([0.2, 0.2], 4), np.array([4, 4]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]), True)
    assert lengths.tolist() == [0, 0]  # every position costs a full forward: plain step


def test_a_later_position_more_likely_than_the_first_is_worth_drafting_through():
    """Per-position estimates: a weak first token followed by a sure copy pays as a whole
    ((1 + 0.3 + 0.297 + 0.294) / 1.6 = 1.18 tokens per unit cost) where a constant estimate of
    0.3 drafts nothing (at most 1.42 / 1.6)."""
    costs = np.array([1.0, 1.6, 1.6, 1.6])  # a fixed price for verifying at all, as on a CPU
    assert draft_lengths(np.array([[0.3, 0.99, 0.99]]), np.array([3]), costs, False)[0].tolist() == [3]
    assert draft_lengths(constant([0.3], 3), np.array([3]), costs, False)[0].tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.floats(0.01, 0.99), min_size=3, max_size=3), st.integers(0, 3)),
             min_size=1, max_size=3),
    st.floats(0.0, 1.2),
    st.booleans(),
)
def test_lengths_are_optimal_against_brute_force(rows, slope, padded):
    acceptance = np.array([r for r, _ in rows])
    limits = np.array([k for _, k in rows], dtype=np.int64)
    cost = lambda n: 1.0 + slope * (n - 1) ** 0.8
    n = len(rows)

    def value(lengths):
        expected = sum(sum(np.prod(r[:j]) for j in range(k + 1)) for r, k in zip(acceptance, lengths))
        return expected / (cost(n * (max(lengths) + 1)) if padded else cost(n + sum(lengths)))

    if padded:
        step_costs = np.array([cost(n * (k + 1)) for k in range(int(limits.max()) + 1)])
        choices = [[min(k, int(limit)) for limit in limits] for k in range(int(limits.max()) + 1)]
    else:
        step_costs = flattened_costs(n, limits, cost)
        choices = itertools.product(*(range(k + 1) for k in limits))
    best = max(value(c) for c in choices)
    got, got_value = draft_lengths(acceptance, limits, step_costs, padded)
    assert (got <= limits).all()
    assert value(got) == pytest.approx(best, rel=1e-9) and got_value == pytest.approx(best, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6), st.integers(0, 6)),
             min_size=0, max_size=6),
    st.lists(st.floats(0.2, 5.0), min_size=37, max_size=37),
    st.booleans(),
)
def test_kernel_matches_its_reference(rows, costs, padded):
    acceptance = np.array([r for r, _ in rows], dtype=np.float64).reshape(len(rows), 6)
    limits = np.array([k for _, k in rows], dtype=np.int64)
    step_costs = np.array(costs, dtype=np.float64)
    got, got_value = draft_lengths(acceptance, limits, step_costs, padded)
    want, want_value = draft_lengths_reference(acceptance, limits, step_costs, padded)
    assert got_value == pytest.approx(want_value, rel=1e-12)
    values = sorted((v for _, v in candidates_reference(acceptance, limits, step_costs, padded)), reverse=True)
    if len(values) < 2 or values[0] - values[1] > 1e-9 * values[0]:  # no near-tie: the same choice
        assert got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.floats(0.0, 1.0), st.floats(0.0, 0.3),
       st.sampled_from([0.7, 1.0, 1.5]), st.integers(1, 96), st.floats(-0.5, 2.0))
def test_many_rows_under_engine_like_costs_size_as_the_reference(seed, rows, lowest, slope, power, step, jump):
    """Many rows and a step cost shaped like an engine's (rising as a power of the tokens, with
    a jump or a dip at some total, as a learned one may have): the kernel sizes as the
    reference does."""
    rng = np.random.default_rng(seed)
    acceptance = rng.uniform(lowest, 1.0, (rows, 8))
    limits = rng.integers(0, 9, rows).astype(np.int64)
    m = np.arange(int(limits.sum()) + 1, dtype=np.float64)
    step_costs = 1.0 + slope * m**power + jump * (m >= step)
    step_costs = np.maximum(step_costs, 0.2)
    got, got_value = draft_lengths(acceptance, limits, step_costs, False)
    want, want_value = draft_lengths_reference(acceptance, limits, step_costs, False)
    assert got_value == pytest.approx(want_value, rel=1e-12)
    values = sorted((v for _, v in candidates_reference(acceptance, limits, step_costs, False)), reverse=True)
    if len(values) < 2 or values[0] - values[1] > 1e-9 * values[0]:
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("tied_rows", [2, 4, 7])
def test_equal_gains_go_to_the_lower_rows_as_a_stable_sort_orders_them(tied_rows):
    """Rows with the same acceptance tie at every position. A step cost that jumps at the
    third position keeps two: the first two rows' first positions, as a stable sort of every
    position (row-major) orders them; the kernel takes positions from a heap and stops early
    (the jump rules out every larger step), and must break the ties the same way."""
    acceptance, limits = constant([0.6] * tied_rows, 3), np.full(tied_rows, 3, dtype=np.int64)
    step_costs = np.array([1.0, 1.01, 1.02] + [2.0 + 0.1 * k for k in range(3 * tied_rows - 2)])
    got, _ = draft_lengths(acceptance, limits, step_costs, False)
    want, _ = draft_lengths_reference(acceptance, limits, step_costs, False)
    assert got.tolist() == want.tolist() == [1, 1] + [0] * (tied_rows - 2)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=200), st.integers(1, 16))
def test_the_gain_order_is_a_stable_sort(acceptance, positions):
    """_by_gain (bucketed, linear time) orders like np.argsort(-gains, kind="stable"): gains
    r^j as sizing builds them, many tied (equal acceptances, zeros) or nearly so."""
    gains = np.array([r**j for r in acceptance for j in range(1, positions + 1)], dtype=np.float64)
    assert _by_gain(gains).tolist() == np.argsort(-gains, kind="stable").tolist()
    signed = np.concatenate([gains, [-0.0, 0.0, -0.0]])  # a negative zero is a zero, not below one
    assert _by_gain(signed).tolist() == np.argsort(-signed, kind="stable").tolist()


def _linear_costs(slope, width=25):
    """costs[q]: a forward over q tokens, in plain steps (costs[0] unused)."""
    return np.array([0.0] + [1.0 + slope * (q - 1) for q in range(1, width + 1)])


def test_the_loss_bounds_worked_example():
    from ngramspec.draft.sizing import LossBudget

    costs = _linear_costs(1 / 16)
    refused = LossBudget(0.02, 0.5)
    assert refused.cap(costs) == 8
    refused.settle(1, 9, costs)  # all 8 refused: one token for 1.5 plain steps
    assert refused.credit == pytest.approx(0.04) and refused.cap(costs) == 0
    kept = LossBudget(0.02, 0.5)
    kept.settle(9, 9, costs)  # all 8 kept, plus the target's token
    assert kept.credit == pytest.approx(8.04) and kept.cap(costs) == 24


@settings(max_examples=300, deadline=None)
@given(slope=st.floats(0.0, 1.0), bumps=st.lists(st.floats(0.0, 0.5), min_size=24, max_size=24),
       max_loss=st.floats(0.0, 0.2), first_risk=st.floats(0.0, 2.0),
       steps=st.lists(st.tuples(st.integers(0, 24), st.floats(0.0, 1.0)), min_size=1, max_size=200))
def test_the_loss_bound_holds_whatever_the_target_keeps(slope, bumps, max_loss, first_risk, steps):
    """Drafts as long as the budget allows (or shorter), the target keeping any prefix, under
    any cost table (a learned one may dip: bumps): the steps' forwards cost at most
    (1 + max_loss) x their tokens + first_risk plain steps."""
    from ngramspec.draft.sizing import LossBudget

    costs = _linear_costs(slope)
    costs[2:] += np.array(bumps)  # costs[1] stays the plain step
    budget, spent, emitted = LossBudget(max_loss, first_risk), 0.0, 0
    for wanted, share in steps:
        cap = budget.cap(costs)
        assert cap == max([k for k in range(len(costs) - 1) if costs[k + 1] - 1 <= budget.credit], default=0)
        drafted = cap if wanted > cap else max(k for k in range(wanted + 1) if costs[k + 1] - 1 <= budget.credit)
        kept = int(share * drafted)
        budget.settle(kept + 1, drafted + 1, costs)
        spent, emitted = spent + costs[drafted + 1], emitted + kept + 1
        assert budget.credit >= 0
    assert spent <= (1 + max_loss) * emitted + first_risk + 1e-9


@pytest.mark.parametrize("max_loss, first", [(0.02, 8), (None, 16)])  # a bound, and none (the default)
def test_a_requests_first_draft_risks_only_first_risk(max_loss, first):
    """A prompt that repeats one stretch: the first draft continues a 64-token match, estimated
    near-certain, so expected value alone buys 16 tokens (2 plain steps at this cost curve, past
    which it grows faster). The bound cuts it to what first_risk (0.5 plain steps) affords: 8. Once
    refused, the request drafts nothing until its credit affords a token again."""
    from ngramspec import NgramSpeculator
    from ngramspec.draft.session import SpeculationSession

    config = NgramSpeculator(verify_cost=((1, 1.0), (17, 2.0)), max_loss=max_loss).config
    stretch = np.random.default_rng(0).integers(0, 500, 40).tolist()
    session = SpeculationSession(config, np.array(stretch * 4, dtype=np.int32))
    assert len(session.propose()) == first
    session.extend(np.array([stretch[1]], dtype=np.int32))  # refused at once (the copy predicts stretch[0])
    assert (len(session.propose()) == 0) == (max_loss == 0.02)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=12), st.lists(st.floats(0.2, 5.0), min_size=13, max_size=13))
def test_one_row_is_sized_alike_both_ways(acceptance, costs):
    """A single request's draft is sized by the padded kernel (the flattened one's sort is left
    uncompiled in a transformers process): for one row the two agree exactly, lengths and value."""
    from ngramspec.draft.sizing import flattened_lengths, padded_lengths

    row = np.array([acceptance], dtype=np.float64).reshape(1, len(acceptance))
    limits = np.array([len(acceptance)], dtype=np.int64)
    step_costs = np.array(costs, dtype=np.float64)
    padded, padded_value = padded_lengths(row, limits, step_costs)
    flattened, flattened_value = flattened_lengths(row, limits, step_costs)
    assert padded.tolist() == flattened.tolist() and padded_value == flattened_value

"""The cost model: the context-aware prior, online refinement from forward timings, and the
decode loop with a scripted forward cost (a fake clock) drafting only where drafts pay."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramspec import NgramSpeculator
from ngramspec.cost.costmodel import CostModelTuning, OnlineCost
from ngramspec.cost.curves import CostCurve, CostPrior
from ngramspec.cost.fit import line_scale, weighted_median
from ngramspec.cost.timer import ForwardTimer
from ngramspec.hf.decode import Options, StopRule, speculative_decode

from reference_fit import line_scale_reference, weighted_median_reference
from test_decode import FakeTarget, plain

LOW = CostCurve(((1, 1.0), (16, 2.0)))
HIGH = CostCurve(((1, 1.0), (16, 4.0)))


def test_prior_interpolates_in_log_context_and_holds_outside():
    prior = CostPrior(((1, 100, LOW.points), (1, 10_000, HIGH.points)))
    assert prior.relative(16, 50) == 2.0 and prior.relative(16, 100) == 2.0 and prior.relative(16, 20_000) == 4.0
    assert prior.relative(16, 1000) == pytest.approx(3.0)  # halfway in log(context)
    assert prior.relative(1, 1000) == 1.0
    # A batch of 4 rows x 4 positions (16 tokens) against its plain step (4 tokens)
    assert prior.relative(16, 100, rows=4) == pytest.approx(2.0 / LOW(4))


def scripted(tokens: int, context: int) -> float:
    """Seconds of a forward: 10 ms, +1 ms per token and +0.2 us per token and context token."""
    return 0.010 + 0.001 * tokens + 2e-7 * tokens * context


def test_online_estimate_converges_to_the_scripted_curve():
    model = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    assert model(8, 3000) == pytest.approx(LOW(8))  # nothing measured: the prior
    for _ in range(5):
        for q in (1, 4, 13):
            model.observe(q, 3000, scripted(q, 3000))
    truth = {q: scripted(q, 3000) / scripted(1, 3000) for q in (4, 13)}
    assert model(4, 3000) == pytest.approx(truth[4]) and model(13, 3000) == pytest.approx(truth[13])
    # An unmeasured size: the prior's excess cost, scaled as the measured sizes say.
    scale = np.median([(truth[q] - 1) / (LOW(q) - 1) for q in (4, 13)])
    assert model(8, 3000) == pytest.approx(1 + (LOW(8) - 1) * scale)
    # The nearest measured context informs an unmeasured one; a far one keeps the prior.
    assert model(8, 3500) == pytest.approx(1 + (LOW(8) - 1) * scale, rel=0.05)
    assert model(8, 60) == pytest.approx(LOW(8))


def test_one_slow_step_does_not_swing_the_estimate():
    model = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    for _ in range(6):
        model.observe(1, 500, 0.010)
        model.observe(8, 500, 0.015)
    model.observe(8, 500, 1.5)  # a noisy neighbour took the CPU for one step
    assert model(8, 500) == pytest.approx(1.5)
    assert not model.needs_baseline(500) and model.needs_baseline(5000)


def test_table_follows_new_timings():
    model = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    for _ in range(3):
        model.observe(1, 500, 0.010)
        model.observe(4, 500, 0.020)
    assert model.table(500, 5)[4] == pytest.approx(2.0)
    for _ in range(15):
        model.observe(4, 500, 0.030)
    assert model.table(500, 5)[4] == pytest.approx(3.0)


def test_a_stale_estimate_heals_once_plain_steps_show_the_load_has_changed():
    """A slow patch inflated the 8-token cell and drafting stopped: plain steps at the normal
    speed must bring the estimate back to the prior (here and in the context next to it), so
    drafting is tried again; steady drafting keeps its measurements."""
    model = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    for _ in range(CostModelTuning().window):
        model.observe(1, 500, 0.030)  # everything slow during the patch
        model.observe(8, 500, 0.120)
    assert model(8, 500) == pytest.approx(4.0) and model(8, 720) == pytest.approx(4.0)  # the next context: scaled
    for _ in range(CostModelTuning().window - 1):
        model.observe(1, 500, 0.010)  # the patch is over; only plain steps now
    assert model(8, 500) == pytest.approx(0.120 / 0.010)  # not yet: one slow one-token timing left
    model.observe(1, 500, 0.010)
    assert model(8, 500) == pytest.approx(LOW(8)) and model(8, 720) == pytest.approx(LOW(8))
    model.observe(8, 500, 0.013)  # drafting tried again: its first timing counts at once
    assert model(8, 500) == pytest.approx(1.3)

    steady = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    for _ in range(3):
        steady.observe(1, 500, 0.010)
    for _ in range(100):
        steady.observe(8, 500, 0.013)  # drafting all along: no plain step refreshes the baseline
    assert steady(8, 500) == pytest.approx(1.3)


def test_a_neighbouring_context_does_not_keep_a_stale_estimate_alive():
    """The request left context 800 during a slow patch (that bucket is never re-timed); at
    1100 the patch ends and plain steps refresh the baseline: neither the dropped cell nor the
    neighbour's equally old one may speak for 1100 any more."""
    model = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    for _ in range(CostModelTuning().window):
        model.observe(1, 800, 0.030)
    for _ in range(3):
        model.observe(8, 800, 0.120)
        model.observe(1, 1100, 0.030)
        model.observe(8, 1100, 0.120)
    assert model(8, 1100) == pytest.approx(4.0)
    for _ in range(CostModelTuning().window):
        model.observe(1, 1100, 0.010)  # the patch is over
    assert model(8, 1100) == pytest.approx(LOW(8))


def test_cells_added_while_a_scale_is_computed_do_not_break_it():
    """One speculator serves several threads: a timing may arrive from another generate() while
    this one computes the excess scale (it iterates over the cells). Simulated deterministically:
    the prior, called inside that computation, observes a new cell."""
    model = OnlineCost()
    low = CostPrior(((1, 100, LOW.points),))

    class Meddling:
        def relative(self, tokens, context, rows=1):
            model.observe(100 + model.observations, context, 0.02)  # what another thread would do meanwhile
            return low.relative(tokens, context, rows)

    model.prior = Meddling()
    for q in (1, 4):  # one drafted size: no line through measured sizes, so the prior is read
        for _ in range(3):
            model.observe(q, 500, 0.010 * (1 + q / 10))
    assert model(5, 500) > 1 and model.table(500, 8)[8] > 1


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class ClockedTarget(FakeTarget):
    """The fake target of test_decode, whose forwards take scripted time on a fake clock."""

    def __init__(self, clock, seconds, rows: int = 1):
        super().__init__(rows)
        self.clock, self.seconds = clock, seconds

    def forward(self, ids, positions, mask, keep, visible=None):
        self.clock.now += self.seconds(ids.numel(), len(self.cache[0]))  # tokens of all rows
        return super().forward(ids, positions, mask, keep, visible)


def decode_with_clock(seconds, max_new=200, seed=0):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, 16, size=40).tolist()
    spec = NgramSpeculator(min_n=1)  # verify_cost=None: the cost model decides
    clock = Clock()
    options = Options(stop=StopRule(max_length=len(prompt) + max_new, eos_token_ids=frozenset({1})),
                      forward_cost=spec.cost_model, timer=ForwardTimer(spec.cost_model, "cpu", clock))
    result = speculative_decode(torch.tensor([prompt]), None, torch.arange(len(prompt))[None], [spec.start(prompt)],
                                ClockedTarget(clock, seconds), options)
    new = result.sequences[0, len(prompt) :].tolist()
    assert new == plain(prompt, len(prompt) + max_new)
    return result.stats[0], spec.cost_model, len(prompt)


def test_drafts_where_extra_positions_are_cheap():
    stats, model, context = decode_with_clock(lambda q, ctx: 0.010 + 0.0002 * q)
    assert stats.accepted_tokens > 60 and stats.mat > 1.8
    assert model(13, context + 100) < 1.3 < model.prior.relative(13, context + 100)  # cheaper than the prior said


def test_declines_where_every_position_costs_a_full_forward():
    """Verifying q tokens costs q one-token forwards: no draft can pay. The prior (a CPU curve)
    says drafts are cheap; the timings say otherwise, and the drafter stops drafting."""
    stats, model, context = decode_with_clock(lambda q, ctx: 0.010 * q)
    steps = stats.verified_per_step
    late = steps[len(steps) // 2 :]
    # Late drafts: only the probes that re-time sizes dropped as stale (costmodel's healing).
    assert sum(1 for k in late if k) <= len(late) // 8, f"still drafting in {sum(1 for k in late if k)} late steps"
    assert stats.declined_steps > len(steps) // 2
    assert model(8, context + 150) > 6  # learnt: near 8x, not the prior's 1.4x


def test_forward_timer_on_cpu_uses_the_clock():
    model, clock = OnlineCost(), Clock()
    timer = ForwardTimer(model, torch.device("cpu"), clock)
    for q in (1, 1, 1, 5, 5, 5):
        timer.start()
        clock.now += 0.01 * (1 + q / 10)
        timer.stop(q, 1000)
    assert model(5, 1000) == pytest.approx(1.5 / 1.1)


def test_forward_timer_on_cuda_reads_events_only_once_complete(monkeypatch):
    """On CUDA the timer records two events per forward and reads them only after query()
    says the device has passed them (a step or more later): it never synchronizes and never
    asks a pending event for its time, so timing adds no host-device sync to the loop."""
    log = []

    class FakeEvent:  # torch.cuda.Event: done once the fake device reaches it
        made = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            self.index = FakeEvent.made
            FakeEvent.made += 1

        def record(self):
            log.append(("record", self.index))

        def query(self):
            return self.index < device_done[0]

        def elapsed_time(self, end):
            assert end.query(), "elapsed_time on a pending event waits for the device"
            return 10.0 * (1 + forward_tokens[self.index // 2] / 10)  # milliseconds

        def synchronize(self):
            raise AssertionError("the timer must not wait on an event")

    device_done, forward_tokens = [0], []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (_ for _ in ()).throw(AssertionError("synchronize")))
    model = OnlineCost()
    timer = ForwardTimer(model, torch.device("cuda"))
    for q in (1, 1, 1, 5, 5, 5, 1, 1):
        forward_tokens.append(q)
        timer.start()
        timer.stop(q, 1000)
        device_done[0] = FakeEvent.made - 2  # the device runs one forward behind the host
    # Each forward is read when the next-but-one starts: all but the last two were read.
    assert model(5, 1000) == pytest.approx(1.5 / 1.1)
    assert [tokens for _, _, tokens, _, _ in timer._pending] == [1, 1]


def test_a_batch_learns_its_costs_from_its_own_plain_steps():
    """Costs relative to a plain step of the same rows: a batch never runs a one-token
    forward, so it measures against its own plain steps (a marginal draft gives way to one
    where none was timed yet)."""
    model = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    assert model(12, 500, rows=4) == pytest.approx(LOW(12) / LOW(4))  # nothing measured: the prior, per plain step
    for _ in range(3):
        model.observe(4, 500, 0.040, rows=4)  # plain steps of 4 rows
        model.observe(12, 500, 0.100, rows=4)  # 2 drafts per row
    assert model(12, 500, rows=4) == pytest.approx(2.5) and model.needs_baseline(500, rows=3)
    assert model(12, 500) == pytest.approx(LOW(12))  # one row: its own cells (none yet)


def test_a_batch_declines_where_every_position_costs_a_full_forward():
    """Three rows, every verified position as dear as a token: the batch stops drafting once
    its own plain and drafted steps are timed (it never runs a one-token forward, so a cost
    model that only knew one-token forwards kept the prior and drafted at a loss)."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(2, 16, size=40).tolist() for _ in range(3)]
    spec = NgramSpeculator(min_n=1)
    clock = Clock()
    ids = torch.tensor(prompts)
    options = Options(stop=StopRule(max_length=40 + 160, eos_token_ids=frozenset({1})),
                      forward_cost=spec.cost_model, timer=ForwardTimer(spec.cost_model, "cpu", clock))
    result = speculative_decode(ids, None, torch.arange(40).repeat(3, 1), [spec.start(p) for p in prompts],
                                ClockedTarget(clock, lambda tokens, ctx: 0.010 * tokens, rows=3), options)
    for b, prompt in enumerate(prompts):
        new = result.sequences[b, 40:].tolist()
        assert new[: len(plain(prompt, 200))] == plain(prompt, 200)
    steps = result.stats[0].verified_per_step
    late = steps[len(steps) // 2 :]
    # Late drafts: only the probes that re-time sizes dropped as stale (costmodel's healing): a
    # burst of ~8 steps (min_samples timings per size) in the 71 late steps; drafting on would be ~all.
    assert sum(1 for k in late if k) <= len(late) // 6, f"still drafting in {sum(1 for k in late if k)} late steps"
    assert spec.cost_model(12, 150, rows=3) > 3  # learnt: ~4x a plain step, the prior says ~1.1x


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 4), st.floats(0.001, 1.0)), max_size=40), st.integers(1, 10),
       st.sampled_from([0.01, 0.05, 0.5]))
def test_the_step_line_kernel_matches_its_reference(points, min_steps, min_spread):
    x = np.array([p[0] for p in points], dtype=np.float64)
    seconds = np.array([p[1] for p in points], dtype=np.float64)
    if len(points) < 2:
        x, seconds = np.concatenate([x, [0.0, 1.0]]), np.concatenate([seconds, [0.01, 0.02]])
    got, want = line_scale(x, seconds, min_steps, min_spread), line_scale_reference(x, seconds, min_steps, min_spread)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5])),
                          st.one_of(st.integers(0, 2**50), st.sampled_from([0, 1, 3]))), min_size=1, max_size=300))
def test_the_weighted_median_selection_is_the_sorted_one(pairs):
    """line_scale's median: any float64 values but NaN (ties, infinities, subnormals, both
    zeros) and any weights (zeros, equal ones, one that outweighs the rest)."""
    values = np.array([p[0] for p in pairs], dtype=np.float64)
    weights = np.array([p[1] for p in pairs], dtype=np.int64)
    want = weighted_median_reference(values, weights)
    assert weighted_median(values.copy(), weights.copy()) == want


def test_the_weighted_median_is_the_value_where_half_the_weight_is_reached():
    values, weights = np.array([3.0, 1.0, 2.0, 2.0]), np.array([1, 1, 2, 3])
    assert weighted_median(values, weights) == 2.0  # up to 1: 1 of 7; up to 2: 6 of 7
    assert weighted_median(np.array([1.0, 2.0]), np.array([1, 1])) == 1.0  # exactly half: the lower
    assert weighted_median(np.array([1.0, 2.0]), np.array([1, 2])) == 2.0
    assert weighted_median(np.array([5.0, 4.0]), np.array([0, 0])) == 4.0  # no weight: the least


def test_the_timed_context_is_where_most_forwards_were_timed():
    """A bench reads the learned curve there: elsewhere the model reads the prior."""
    model = OnlineCost()
    assert model.timed_context() is None
    for _ in range(4):
        model.observe(1, 400, 0.010)
    for _ in range(9):
        for q in (1, 4):
            model.observe(q, 2000, 0.020 * q ** 0.5)
    model.observe(1, 300, 0.05, rows=2)  # another row count: its own
    assert model.timed_context() == OnlineCost.context_of(OnlineCost.bucket(2000))
    assert model.timed_context(rows=2) == OnlineCost.context_of(OnlineCost.bucket(300))
    assert model(4, model.timed_context()) == pytest.approx(2.0)  # measured there: 2x a plain step
    assert model(4, 100) != pytest.approx(2.0)  # far from every timing: the prior


def test_engine_steps_learn_their_scale_per_context():
    """One request at a time: a short request's steps (300 tokens of context, plain step 10 ms,
    extra positions 0.5x the prior's excess) and a long one's (3,000 tokens, 40 ms, 3x). Each
    context keeps its own window, so each scale is its own; one window through both would fit
    the 4x difference of their plain steps, not either scale."""
    prior = CostPrior(((1, 500, ((1, 1.0), (9, 1.4), (25, 2.2))),))
    model = OnlineCost(prior)
    for context, plain_step, scale in ((300, 0.010, 0.5), (3000, 0.040, 3.0)):
        for step in range(40):
            tokens = 1 + (step * 7) % 25  # drafts of many sizes
            model.observe_step(tokens, context, 1, plain_step * (1 + scale * (prior.relative(tokens, context) - 1)))
    assert model.step_scale(1, 300) == pytest.approx(0.5, rel=0.05)
    assert model.step_scale(1, 3000) == pytest.approx(3.0, rel=0.05)
    assert model.step_scale(1, 6000) == pytest.approx(3.0, rel=0.05)  # an unmeasured context: the nearest


def test_a_window_of_draining_rows_learns_the_drafts_cost_not_the_rows():
    """As requests finish, a 16-request engine steps through 11, 10, 9, 8 rows, a few steps
    each, all in one window (a half-octave of row counts), while the drafts grow as rows fall.
    Plain steps of 11 and of 8 rows differ by more than those drafts cost: the line through raw
    seconds read 0.5 in the engine's simulation where drafts cost 4x the prior's excess. Each
    step's seconds per the prior's plain step of its rows must give 4."""
    prior = CostPrior(((1, 500, ((1, 1.0), (9, 1.4), (25, 2.2))), (16, 500, ((16, 4.0), (32, 4.4), (64, 6.0)))))
    model = OnlineCost(prior)
    context = OnlineCost.context_of(OnlineCost.bucket(600))
    assert len({(OnlineCost.bucket(64 * rows)) for rows in (8, 9, 10, 11)}) == 1  # one window
    for step in range(24):
        rows = 11 - step // 6
        tokens = rows + 1 + step % 3 + 2 * (11 - rows)  # longer drafts as rows fall
        excess = prior.relative(tokens, context, rows) - 1
        model.observe_step(tokens, context, rows, 0.01 * float(prior.cost(rows, context, rows)) * (1 + 4 * excess))
    assert model.step_scale(8, context) == pytest.approx(4.0, rel=0.05)


def test_steps_crowded_at_small_drafts_do_not_make_long_drafts_look_free():
    """An engine's true cost curve is more convex than the prior it scales (vLLM one request
    at a time on 2 cores: 1-4 token drafts cost about a plain step, 24 tokens +110%), and most
    steps draft a few tokens. Here four steps in five draft 0-3 tokens at a plain step's cost,
    one drafts 24 at 2x the prior's excess: the scale must come from the pairs that span the
    sizes, not from the crowd of near-equal small drafts (the plain Theil-Sen median read 0.7
    here, and 0.0-0.2 in the engine, so long drafts looked nearly free). A line through a
    convex curve prices the long drafts at about what they cost (2x) or dearer (the small
    drafts pull its intercept down): 2.5 here."""
    prior = CostPrior(((1, 500, ((1, 1.0), (9, 1.4), (25, 2.2))),))
    model = OnlineCost(prior)
    rng = np.random.default_rng(0)
    for step in range(120):
        tokens = 25 if step % 5 == 0 else 1 + step % 4
        excess = 2.0 * (prior.relative(25, 300) - 1) if tokens == 25 else 0.0
        model.observe_step(tokens, 300, 1, 0.010 * (1 + excess) * rng.uniform(0.95, 1.05))
    assert 1.7 <= model.step_scale(1, 300) <= 3.0


def test_engine_steps_join_their_windows_in_order_with_the_priors_excess():
    """observe_step notes a step and files it when a line is next fitted: every window must
    then hold what filing each step at once would (the prior's excess for its total, its
    seconds per the prior's plain step of its rows), in the order they came, with row counts
    and contexts mixed and one of them unseen until then."""
    prior = CostPrior(((1, 500, ((1, 1.0), (9, 1.4), (25, 2.2))), (4, 500, ((4, 1.0), (40, 2.0)))))
    model = OnlineCost(prior)
    rng = np.random.default_rng(1)
    want: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for _ in range(300):
        rows, context = int(rng.choice([1, 4, 16])), int(rng.integers(64, 5000))
        tokens, seconds = rows + int(rng.integers(0, 40)), float(rng.uniform(0.01, 0.02))
        model.observe_step(tokens, context, rows, seconds)
        window = (OnlineCost.bucket(64 * rows), OnlineCost.bucket(context) // 2)
        half_octave = OnlineCost.context_of(OnlineCost.bucket(context))
        excess = prior.relative(tokens, half_octave, rows) - 1
        want.setdefault(window, []).append((excess, seconds / float(prior.cost(rows, half_octave, rows))))
    assert sorted(model.step_windows()) == sorted(want)
    for window, steps in want.items():
        got = list(model._steps[window])
        assert np.allclose([s for _, s in got], [s for _, s in steps[-model.tuning.step_window:]], rtol=1e-12)
        assert np.allclose([x for x, _ in got], [x for x, _ in steps[-model.tuning.step_window:]], rtol=1e-12)


def test_step_costs_between_refits_are_what_asking_afresh_gives():
    """An engine asks step_costs every step and gets the last answer until a refit is due, an
    exploring step comes or its rows, positions or context half-octave change: each answer
    must equal one computed afresh (a twin fed the same steps, its memo cleared every time),
    through row counts, contexts, exploring steps and refits."""
    prior = CostPrior(((1, 500, ((1, 1.0), (9, 1.4), (25, 2.2))), (4, 500, ((4, 1.0), (40, 2.0)))))
    memo, fresh = OnlineCost(prior), OnlineCost(prior)
    rng = np.random.default_rng(2)
    rows, context, changed, last = 4, 300, 0, None
    for step in range(600):
        if rng.random() < 0.05:  # now and then other rows or a longer context
            rows, context = int(rng.choice([1, 4, 8])), int(context * rng.uniform(0.8, 1.6)) % 6000 + 64
        tokens = rows + int(rng.integers(0, 30))
        seconds = 0.01 * (1 + 0.7 * (prior.relative(tokens, context, rows) - 1)) * rng.uniform(0.97, 1.03)
        for model in (memo, fresh):
            model.observe_step(tokens, context, rows, seconds)
        fresh._step_memo = ((), 0, False, None)
        got, want = memo.step_costs(rows, 8 * rows, context, step), fresh.step_costs(rows, 8 * rows, context, step)
        assert np.array_equal(got, want), step
        changed += last is not None and not np.array_equal(got, last)
        last = got
    assert memo.step_scale(4, 300) == pytest.approx(0.7, rel=0.2) and changed > 20


def test_the_tuning_sets_how_many_timings_count():
    """CostModelTuning.min_samples: a cell's median counts from that many timings on."""
    one = OnlineCost(CostPrior(((1, 100, LOW.points),)), tuning=CostModelTuning(min_samples=1))
    three = OnlineCost(CostPrior(((1, 100, LOW.points),)))
    for model in (one, three):
        model.observe(1, 100, 0.01)
    assert not one.needs_baseline(100) and three.needs_baseline(100)

"""ngramspec.vllm.Proposer without vLLM: a fake engine that moves rows the way vLLM's
persistent batch does (finished rows condensed, preempted requests re-prefilled, new
requests in free rows) and verifies drafts greedily against scripted outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import types

from ngramspec.cost.curves import CostPrior
from ngramspec.cost.fit import line_scale
from ngramspec.draft.sessions import ACTIVE, LENGTH
from ngramspec.vllm import VLLM_CPU_PRIOR, Proposer
from ngramspec.vllm.kernels import propose_rows
from ngramspec.vllm.rows import PROBES, RowSessions, find_slot, match_rows, spot_check

from reference_rows import find_slot_reference, match_rows_reference, spot_check_reference

MAX_LEN = 4096


def vllm_config(k=8, max_model_len=MAX_LEN, max_num_seqs=8):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


class FakeEngine:
    """Requests (prompt, scripted greedy output) through a persistent batch of ``slots`` rows."""

    def __init__(self, proposer, slots=8, seed=0):
        self.proposer = proposer
        self.tokens = np.zeros((slots, MAX_LEN), dtype=np.int32)
        self.count = np.zeros(slots, dtype=np.int32)
        self.rows: list = []  # row -> request dict
        self.rng = np.random.default_rng(seed)
        self.draft_log: list[tuple[dict, list[int]]] = []

    def add(self, request):
        """Enter a request (or re-enter a preempted one): its row holds all its tokens so
        far, and it samples nothing on the step that prefills it."""
        row = len(self.rows)
        text = np.concatenate([request["prompt"], request["output"][: request["done"]]])
        self.tokens[row, : len(text)] = text
        self.count[row] = len(text)
        request["sampled"] = []
        request["draft"] = []
        self.rows.append(request)

    def remove(self, row):
        """A finished or preempted request leaves; the last row moves into its place."""
        last = len(self.rows) - 1
        if row != last:
            self.tokens[row] = self.tokens[last]
            self.count[row] = self.count[last]
            self.rows[row] = self.rows[last]
        self.rows.pop()

    def step(self):
        # Verify the drafts of the previous step and emit (prefilled rows emit their first token).
        for row, req in enumerate(self.rows):
            target = req["output"][req["done"] :]
            draft = req["draft"]
            kept = 0
            while kept < len(draft) and kept < len(target) - 1 and draft[kept] == target[kept]:
                kept += 1
            emitted = target[: kept + 1].tolist()
            req["sampled"] = emitted
            req["done"] += len(emitted)
            n = self.count[row]
            self.tokens[row, n : n + len(emitted)] = emitted
            self.count[row] += len(emitted)
        sampled = [req["sampled"] for req in self.rows]
        drafts = self.proposer.propose(sampled, self.count.copy(), self.tokens)
        assert len(drafts) == len(self.rows)
        for req, draft in zip(self.rows, drafts):
            req["draft"] = list(draft)
            self.draft_log.append((req, list(draft)))
        for row in reversed(range(len(self.rows))):
            if self.rows[row]["done"] >= len(self.rows[row]["output"]):
                self.remove(row)


def copying_request(vocab_base, length=120, rng=None):
    """Prompt of random tokens in [vocab_base, vocab_base + 500); output copies stretches."""
    rng = rng or np.random.default_rng(vocab_base)
    prompt = rng.integers(vocab_base, vocab_base + 500, length).astype(np.int32)
    pieces = [prompt[s : s + 15] for s in rng.integers(0, length - 15, 4)]
    output = np.concatenate(pieces + [rng.integers(vocab_base, vocab_base + 500, 10).astype(np.int32)])
    return {"prompt": prompt, "output": output, "done": 0, "base": vocab_base}


def run_engine(proposer, requests, slots=4, preempt_every=0, seed=0, engine_class=FakeEngine):
    engine = engine_class(proposer, slots=slots, seed=seed)
    waiting = list(requests)
    steps = 0
    while waiting or engine.rows:
        while waiting and len(engine.rows) < slots:
            engine.add(waiting.pop(0))
        engine.step()
        steps += 1
        if preempt_every and steps % preempt_every == 0 and engine.rows:
            victim = engine.rows[0]
            engine.remove(0)
            waiting.insert(len(waiting) // 2, victim)  # comes back later, re-prefilled
        assert steps < 10_000
    return engine


@pytest.mark.parametrize("preempt_every", [0, 7])
def test_drafts_come_from_the_row_own_request_as_rows_move(preempt_every):
    requests = [copying_request(1000 * (i + 1)) for i in range(10)]
    proposer = Proposer(vllm_config(k=8))
    engine = run_engine(proposer, requests, slots=4, preempt_every=preempt_every)
    drafted = [(req, d) for req, d in engine.draft_log if d]
    assert len(drafted) > 50  # the outputs copy their prompts: drafting happened
    for req, draft in drafted:
        base = req["base"]
        assert all(base <= t < base + 500 for t in draft), "a draft came from another request"
    accepted = sum(len(r["output"]) for r in requests)
    assert accepted == sum(r["done"] for r in requests)
    assert proposer.failures == 0
    # Rows moved and requests were preempted, yet no session was rebuilt from a whole row:
    # one session per request.
    assert proposer.sessions.created == len(requests)


def test_sessions_of_finished_requests_are_freed():
    proposer = Proposer(vllm_config(k=4, max_num_seqs=4))
    rng = np.random.default_rng(5)
    requests = [copying_request(1000 + 1000 * (i % 20), length=40, rng=rng) for i in range(300)]
    run_engine(proposer, requests, slots=4)
    sessions = proposer.sessions
    assert len(sessions.idle) <= sessions.max_idle == 64
    assert len(sessions.rows) <= 4
    assert sessions.table.state.shape[0] <= 2 * (sessions.max_idle + 4)  # evicted slots are reused
    assert sessions.idle_tokens == sum(sessions.length(s) for s in sessions.idle)
    # Finished outputs joined the shared history (bounded by history_tokens) as they finished.
    history = proposer.speculator.history
    assert 0 < history.index.length <= history.capacity


def test_idle_sessions_are_bounded_by_tokens_too():
    proposer = Proposer(vllm_config(k=4))
    proposer.sessions.max_idle_tokens = 1000
    rng = np.random.default_rng(6)
    run_engine(proposer, [copying_request(1000, length=200, rng=rng) for _ in range(30)], slots=2)
    assert 0 < proposer.sessions.idle_tokens <= 1000


def test_identical_rows_get_separate_sessions():
    prompt = np.arange(100, 160, dtype=np.int32)
    output = np.tile(np.arange(120, 140, dtype=np.int32), 3)
    requests = [{"prompt": prompt, "output": output, "done": 0, "base": 100} for _ in range(3)]
    proposer = Proposer(vllm_config(k=8))
    run_engine(proposer, requests, slots=3)
    assert proposer.sessions.created == 3
    assert all(r["done"] == len(output) for r in requests)


def step(sessions: RowSessions, rows: dict) -> dict:
    """One RowSessions step over {row index: its text}; {row index: slot}."""
    token_ids = np.zeros((max(rows) + 1, max(map(len, rows.values()))), dtype=np.int32)
    for i, text in rows.items():
        token_ids[i, : len(text)] = text
    index = np.array(list(rows), dtype=np.int64)
    slots = sessions.step(token_ids, index, np.array([len(t) for t in rows.values()], dtype=np.int64))
    sessions.table.draft(token_ids, index, np.array([len(t) for t in rows.values()]), slots, np.zeros(len(rows)))
    sessions.table.state[slots, ACTIVE] = 1  # drafted nothing: the next step verifies nothing
    sessions.retire()
    return dict(zip(rows, slots.tolist()))


def test_a_row_taken_by_another_request_with_the_same_head_gets_a_new_session():
    speculator = Proposer(vllm_config()).speculator
    sessions = RowSessions(speculator)
    shared = np.arange(10, 60, dtype=np.int32)  # a common system prompt
    a = np.concatenate([shared, np.full(30, 7, dtype=np.int32)])
    b = np.concatenate([shared, np.arange(300, 330, dtype=np.int32)])
    first = step(sessions, {0: a})[0]
    second = step(sessions, {0: b})[0]
    assert first != second
    assert sessions.created == 2
    assert first in sessions.idle


def test_a_session_that_fails_its_check_is_not_offered_to_its_row_again():
    """A same-length near-identical request in the row: its old session fails the spot check
    once and the lookup skips it (checked again, it would fail again at best); another slot
    it continues is still found."""
    sessions = RowSessions(Proposer(vllm_config()).speculator)
    row = np.arange(1000, 1200, dtype=np.int32)
    old = step(sessions, {0: row})[0]
    other = row.copy()
    other[-5:] += 1  # the same head, another tail
    new = step(sessions, {0: other})[0]
    assert new != old and sessions.created == 2
    table, uniforms = sessions.table, np.zeros(PROBES)
    taken = np.zeros(table.state.shape[0], dtype=np.bool_)
    both = np.array([old, new], dtype=np.int64)
    # The row that continues `new` finds it, unless it is the one excluded or taken.
    assert find_slot(other, both, -1, taken, table.indexes, table.state, uniforms) == new
    assert find_slot(other, both, new, taken, table.indexes, table.state, uniforms) == -1
    taken[new] = True
    assert find_slot(other, both, -1, taken, table.indexes, table.state, uniforms) == -1
    # `row` continues neither (`old` holds its text but is not among the candidates).
    assert find_slot(row, both[1:], -1, taken & False, table.indexes, table.state, uniforms) == -1
    assert find_slot(row, both, -1, taken & False, table.indexes, table.state, uniforms) == old


def test_a_changed_middle_is_caught_by_random_probes():
    speculator = Proposer(vllm_config()).speculator
    sessions = RowSessions(speculator)
    row = np.arange(1000, 3000, dtype=np.int32)
    slot = step(sessions, {0: row})[0]
    forged = row.copy()
    forged[200:1800] = 5  # same head and tail, different text in between
    stream, rng = sessions.table.tokens(slot), np.random.default_rng(0)
    assert spot_check(stream, row, row.size, rng.random(PROBES))
    assert sum(not spot_check(stream, forged, row.size, rng.random(PROBES)) for _ in range(20)) >= 19


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "max_n=3,acceptance_prior=0.6")
    proposer = Proposer(vllm_config(k=10))
    assert proposer.speculator.config.max_n == 3
    assert proposer.speculator.config.acceptance_prior == 0.6
    assert proposer.speculator.config.max_draft_tokens == 10
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "max_nn=3")
    with pytest.raises(ValueError, match="unknown speculator setting 'max_nn'"):
        Proposer(vllm_config())
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "max_draft_tokens=20")
    with pytest.raises(ValueError, match="raise num_speculative_tokens"):
        Proposer(vllm_config(k=10))
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "edit_recurrence=true")  # the one engine learns edits for rows too
    assert Proposer(vllm_config()).sessions.table.knobs.edit_recurrence
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "tree_branches=3")
    with pytest.raises(ValueError, match="tree_branches=3, but vLLM verifies a chain"):
        Proposer(vllm_config())
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "max_loss=0.02")  # a per-request bound: never silently ignored
    with pytest.raises(ValueError, match="max_loss=0.02, but the loss bound applies to generate()"):
        Proposer(vllm_config())
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "max_draft_tokens=64")  # past max_tree_tokens too
    with pytest.raises(ValueError, match="max_draft_tokens=64, above vLLM's num_speculative_tokens=16"):
        Proposer(vllm_config(k=16))


def test_verify_cost_settles_the_prior_and_auto_is_the_built_in_one(monkeypatch):
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "verify_cost=auto")
    assert Proposer(vllm_config(k=8)).prior == VLLM_CPU_PRIOR  # it failed at start before
    monkeypatch.setenv("NGRAMSPEC_SETTINGS", "verify_cost=1:1.0,8:1.5")
    proposer = Proposer(vllm_config(k=8))
    assert proposer.prior.relative(8, 500) == 1.5 and proposer.cost.prior is proposer.prior


def test_no_draft_past_the_model_length():
    proposer = Proposer(vllm_config(k=8, max_model_len=70))
    prompt = np.tile(np.arange(200, 210, dtype=np.int32), 6)  # 60 tokens, periodic
    drafts = proposer.propose([[int(prompt[-1])]], np.array([60]), prompt[None, :].copy())
    assert len(drafts[0]) <= 70 - 60 - 1


@pytest.mark.parametrize("kind", [list, tuple, np.array])
def test_a_prefilling_row_gets_no_draft_whatever_type_its_tokens_come_in(kind):
    """vLLM passes each row's sampled tokens as a list; a row still prefilling sampled nothing
    and must get no draft, whether the rows come as lists (read by truth value), tuples or
    arrays (read by length), and a decoding row sampled token 0 (a false int, a true list)."""
    period = np.arange(0, 10, dtype=np.int32)  # token 0 included
    rows = np.stack([np.tile(period, 6), np.tile(period, 6)])  # two 60-token periodic rows
    for sampled_first in (True, False):
        proposer = Proposer(vllm_config(k=8))
        for end in (55, 56, 57):  # three steps; row 1 prefills in the first unless sampled_first
            second = [int(rows[1, end - 1])] if sampled_first or end > 55 else []
            sampled = [kind([int(rows[0, end - 1])]), kind(second)]
            drafts = proposer.propose(sampled, np.array([end, end]), rows.copy())
        assert drafts[0] and drafts[1], drafts  # periodic text: both rows draft by the last step
        proposer = Proposer(vllm_config(k=8))
        drafts = proposer.propose([kind([0]), kind([])], np.array([51, 50]), rows.copy())
        assert drafts[1] == [] and proposer.failures == 0


def test_the_prior_interpolates_tokens_and_requests_and_reads_cost_files(tmp_path):
    prior = CostPrior(((1, 500, ((1, 1.0), (9, 2.0))), (5, 500, ((5, 2.0), (21, 4.0)))))
    assert prior.cost(1, 500, 1) == 1.0
    assert prior.cost(5, 500, 1) == 1.5  # linear in tokens
    assert prior.cost(18, 500, 1) == 4.0  # past the last point: in proportion to tokens
    assert prior.cost(5, 500, 5) == 2.0 and prior.relative(21, 500, 5) == 2.0  # against 5 rows' plain step
    assert prior.cost(5, 500, 3) == pytest.approx((1.5 + 2.0) / 2)  # halfway between the request counts
    one, five = 2.0 * 21 / 9, 4.0
    assert prior.cost(21, 500, 9) == pytest.approx(five + (five - one))  # past 5 requests: the difference continues
    path = tmp_path / "cost.json"  # what eval.vllm_cost writes (one context)
    path.write_text('{"curves": {"1": [[1, 1.0], [9, 2.0]], "5": [[5, 2.0], [21, 4.0]]}}')
    assert CostPrior.from_file(str(path)).relative(21, 10_000, 5) == 2.0
    path.write_text(prior.to_json())
    assert CostPrior.from_file(str(path)) == prior
    assert prior.scaled(2.0).cost(9, 500) == 3.0  # excess cost doubled: a prior 2x wrong
    # ... relative to each row count's plain step: 5 requests' excess doubles too
    assert prior.scaled(2.0).relative(21, 500, 5) - 1 == pytest.approx(2 * (prior.relative(21, 500, 5) - 1))
    with pytest.raises(ValueError, match="two or more"):
        CostPrior(((1, 500, ((1, 1.0),)),))


def test_the_cost_file_from_the_environment_sizes_drafts(monkeypatch, tmp_path):
    path = tmp_path / "cost.json"
    path.write_text('{"curves": {"1": [[1, 1.0], [2, 2.0], [32, 32.0]]}}')  # every position costs a token
    monkeypatch.setenv("NGRAMSPEC_VLLM_COST", str(path))
    proposer = Proposer(vllm_config(k=8))
    assert proposer.prior.relative(16, 500) == 16.0
    prompt = np.tile(np.arange(200, 210, dtype=np.int32), 6)
    drafts = proposer.propose([[int(prompt[-1])]], np.array([60]), prompt[None, :].copy())
    assert drafts == [[]]  # no draft pays when verifying costs as much as decoding


def test_a_drafting_error_never_reaches_the_engine(monkeypatch, caplog):
    proposer = Proposer(vllm_config(k=8))
    prompt = np.tile(np.arange(200, 210, dtype=np.int32), 6)
    args = ([[int(prompt[-1])]], np.array([60]), prompt[None, :].copy())
    monkeypatch.setattr(RowSessions, "step", lambda self, *rows: 1 / 0)
    assert proposer.propose(*args) == [[]]
    assert proposer.failures == 1 and "ngramspec drafting failed" in caplog.text
    monkeypatch.undo()
    assert proposer.propose(*args)[0]  # drafting resumes with fresh sessions


def test_repeated_drafting_errors_back_off(monkeypatch):
    """Each failure restarts every session (a whole-text re-index per row at the next step):
    failures in a row pause drafting for 2, 4, 8, ... steps, and a success resets that."""
    proposer = Proposer(vllm_config(k=8))
    prompt = np.tile(np.arange(200, 210, dtype=np.int32), 6)
    args = ([[int(prompt[-1])]], np.array([60]), prompt[None, :].copy())
    tries = []
    monkeypatch.setattr(RowSessions, "step", lambda self, *rows: tries.append(1) / 0)
    for _ in range(1 + 1 + 2 + 1 + 4 + 1):  # fail, fail, 2 paused, fail, 4 paused, fail
        assert proposer.propose(*args) == [[]]
    assert len(tries) == proposer.failures == 4
    monkeypatch.undo()
    for _ in range(8):  # 8 paused steps, then drafting resumes
        assert proposer.propose(*args) == [[]]
    assert proposer.propose(*args)[0] and proposer._failed_in_a_row == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=80), st.integers(0, 80), st.integers(-1, 79),
       st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=0, max_size=8))
def test_spot_check_kernel_matches_its_reference(tokens, extra, changed, uniforms):
    stream = np.array(tokens, dtype=np.int32)
    row = np.concatenate([stream, np.arange(extra, dtype=np.int32)])
    if 0 <= changed < stream.size:
        row[changed] += 1  # one position differs (or none)
    uniforms = np.array(uniforms, dtype=np.float64)
    assert spot_check(stream, row, stream.size, uniforms) == spot_check_reference(stream, row, stream.size, uniforms)
    # A row shorter than the stream, or an empty stream, never holds it.
    assert not spot_check(stream, row[: stream.size - 1], stream.size, uniforms)
    assert not spot_check(stream, row, 0, uniforms) and not spot_check_reference(stream, row, 0, uniforms)


def prefix_slots(texts, seen):
    """Six slots, slot s holding the first ``seen[s]`` tokens of ``texts[s % len(texts)]``: (the
    slots' (stream, table) pairs as a typed list, their streams as a list, state)."""
    from numba.typed import List

    from ngramspec.draft.sessions import INDEX

    indexes = List.empty_list(INDEX)
    state = np.zeros((6, 19), dtype=np.int64)
    for s in range(6):
        text = np.array(texts[s % len(texts)], dtype=np.int32)
        indexes.append((text.copy(), np.zeros(16, dtype=np.uint64)))
        state[s, LENGTH] = min(seen[s], text.size)
    return indexes, [stream for stream, _ in indexes], state


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=40), min_size=1, max_size=6),
       st.integers(0, 5), st.lists(st.integers(0, 40), min_size=6, max_size=6), st.integers(-1, 5),
       st.lists(st.booleans(), min_size=6, max_size=6), st.lists(st.integers(0, 5), max_size=8),
       st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=PROBES, max_size=PROBES))
def test_find_slot_kernel_matches_its_reference(texts, pick, seen, excluded, taken, order, uniforms):
    """Slots holding prefixes of small-alphabet texts (so heads often agree and probes decide),
    a row continuing one of them: the kernel picks the slot the reference picks."""
    indexes, streams, state = prefix_slots(texts, seen)
    row = np.concatenate([np.array(texts[pick % len(texts)], dtype=np.int32), np.arange(3, dtype=np.int32)])
    candidates, taken = np.array(order, dtype=np.int64), np.array(taken, dtype=np.bool_)
    args = (row, candidates, excluded, taken, indexes, state, np.array(uniforms))
    plain = (row, candidates, excluded, taken, streams, state, np.array(uniforms))
    assert find_slot(*args) == find_slot_reference(*plain)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=40), min_size=1, max_size=6),
       st.lists(st.integers(0, 5), min_size=1, max_size=6), st.lists(st.integers(0, 40), min_size=6, max_size=6),
       st.lists(st.integers(-1, 5), min_size=0, max_size=8), st.lists(st.integers(0, 5), max_size=8),
       st.lists(st.integers(0, 3), min_size=6, max_size=6), st.integers(1, 1000))
def test_match_rows_kernel_matches_its_reference(texts, picks, seen, row_slots, order, extra, stamp):
    """Rows continuing (or not) slots that hold prefixes of small-alphabet texts, some rows
    remembering a slot, some not: each row keeps, takes or misses the slot the reference says."""
    from ngramspec.vllm.rows import draw_probes

    indexes, streams, state = prefix_slots(texts, seen)
    count = len(picks)
    token_ids = np.zeros((count, 48), dtype=np.int32)
    ends = np.zeros(count, dtype=np.int32)
    for r, pick in enumerate(picks):
        text = np.array(texts[pick % len(texts)] + [1] * extra[r], dtype=np.int32)[:48]
        token_ids[r, : text.size], ends[r] = text, text.size
    rows = np.arange(count, dtype=np.int64)
    row_slots, candidates = np.array(row_slots, dtype=np.int64), np.array(order, dtype=np.int64)
    had, slots = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
    match_rows(token_ids, rows, ends, row_slots, candidates, indexes, state, stamp, had, slots)

    def probes_for(seed):
        out = np.empty(PROBES)
        draw_probes(stamp, seed, out)
        return out

    want = match_rows_reference(token_ids, rows, ends, row_slots, candidates, streams, state, probes_for)
    assert (had.tolist(), slots.tolist()) == want
    kept = [s for s in slots.tolist() if s >= 0]
    assert len(kept) == len(set(kept))  # no slot twice


def test_the_cpu_step_cost_on_an_accelerator_is_flagged(caplog):
    config = vllm_config(k=4)
    with caplog.at_level("WARNING", logger="ngramspec.vllm"):
        Proposer(config)
        assert not caplog.records  # a CPU engine: the built-in cost fits
        config.device_config = SimpleNamespace(device_type="cuda")
        Proposer(config)
    assert len(caplog.records) == 1 and "measured on a 2-core CPU, but this engine runs on cuda" in caplog.text


class TimedEngine(FakeEngine):
    """A FakeEngine whose steps take time on a fake clock: a step over T scheduled tokens of R
    rows takes 10 ms x (1 + true_scale x (the prior's excess cost of T)), times noise."""

    def __init__(self, proposer, true_scale, slots, seed=0, slow=()):
        super().__init__(proposer, slots=slots, seed=seed)
        self.now, self.true_scale, self.slow, self.steps = 0.0, true_scale, slow, 0
        self.noise = np.random.default_rng(seed)
        proposer.clock = lambda: self.now

    def step(self):
        rows = len(self.rows)
        if rows:
            scheduled = sum(1 + len(req["draft"]) for req in self.rows)
            context = int(np.mean(self.count[:rows]))
            excess = self.proposer.prior.relative(scheduled, context, rows) - 1
            seconds = 0.010 * (1 + self.true_scale * excess) * self.noise.uniform(0.9, 1.1)
            self.now += seconds * (10 if self.steps in self.slow else 1)  # a noisy neighbour
        self.steps += 1
        super().step()


def drafting_with(true_scale, slow=(), settings=None, seed=0):
    proposer = Proposer(vllm_config(k=8, max_num_seqs=6), settings=settings)
    rng = np.random.default_rng(3)
    requests = [copying_request(1000 * (i + 1), length=300, rng=rng) for i in range(24)]
    spans = ((10, 12), (100, 30), (200, 7), (50, 25), (150, 18), (20, 40), (220, 9))
    for r in requests:  # outputs that copy spans of varied length: drafts of many sizes, all rows drafting
        r["output"] = np.concatenate([r["prompt"][s : s + n] for s, n in spans])
    engine = TimedEngine(proposer, true_scale, slots=6, slow=slow, seed=seed)
    waiting = list(requests)
    while waiting or engine.rows:
        while waiting and len(engine.rows) < 6:
            engine.add(waiting.pop(0))
        engine.step()
    assert all(r["done"] == len(r["output"]) for r in requests)
    return proposer, proposer.drafted_tokens / proposer.steps


@pytest.mark.parametrize("true_scale", [0.4, 2.5])
def test_the_step_cost_is_learned_from_the_engine_own_steps(true_scale):
    """Extra positions cost 0.4x or 2.5x what the built-in prior says (a machine unlike the one
    it was measured on): the proposer learns that from the time between propose() calls, with
    no cost file, and drafts more where positions are cheaper, fewer where dearer. One run
    learns from ~75 timed steps with +-10% noise each, and its estimate spreads widely (0.14 to
    0.82 for a true 0.4 over five noise seeds: most steps draft alike, so the line rests on a
    few): the median of five runs must be within 25%."""
    learned = np.median([drafting_with(true_scale, seed=seed)[0].cost.step_scale(rows=6) for seed in range(5)])
    assert learned == pytest.approx(true_scale, rel=0.25), learned
    # Copies here are long and mostly kept (up to 48 draft tokens a step, 6 rows x k=8): the
    # cheap machine drafts ~44 a step, near that ceiling, the dear one ~39.
    _, per_step_cheap = drafting_with(0.4)
    _, per_step_dear = drafting_with(2.5)
    assert per_step_cheap > 1.1 * per_step_dear


def test_a_slow_patch_does_not_change_the_learned_scale():
    """Ten steps 10x slower (a noisy neighbour) slow plain and drafted steps alike: the
    learned excess scale stays as close to the machine's as without them (the test above)."""
    learned = np.median([drafting_with(2.5, slow=range(60, 70), seed=seed)[0].cost.step_scale(6) for seed in range(5)])
    assert learned == pytest.approx(2.5, rel=0.25), learned


def test_a_prior_that_forbids_drafting_is_still_corrected():
    """A prior under which no draft pays (every position costs a full token) keeps every step
    plain, and plain steps alone cannot show what a draft costs: an occasional optimistic step
    measures it. Here extra positions really cost a tenth of that: learned, and drafting
    follows."""
    proposer, per_step = drafting_with(0.1, settings="verify_cost=1:1.0,2:2.0,32:32.0")
    assert proposer.cost.step_scale(6) == pytest.approx(0.1, rel=0.3)
    assert per_step > 5


class MatchEveryStep(Proposer):
    """A Proposer that never takes the usual step's compiled path: every step matches rows to
    slots in Python (RowSessions.step) first, as steps where rows came, went or moved do."""

    usual_step = False


def answering_request(answer, vocab_base, rng):
    """A prompt of its own (random tokens in [vocab_base, vocab_base + 500)) and an output that
    is mostly ``answer``, shared by every such request: drafted from the history of the ones
    that finished before."""
    prompt = rng.integers(vocab_base, vocab_base + 500, int(rng.integers(40, 120))).astype(np.int32)
    output = np.concatenate([answer[: int(rng.integers(30, answer.size))], prompt[:5]])
    return {"prompt": prompt, "output": output, "done": 0, "base": vocab_base}


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_the_usual_step_drafts_what_matching_every_step_drafts(seed, shared, monkeypatch):
    """Steps whose rows all kept their slots run as one compiled call (spot checks, extend,
    draft, size); they must draft exactly what matching rows in Python and then drafting does,
    while rows move, finish and are preempted. ``shared``: the outputs repeat one another, so
    when a finished request's output joins the history decides drafts too."""
    logs = []
    usual = []
    same_rows = RowSessions.same_rows
    monkeypatch.setattr(RowSessions, "same_rows", lambda self, c: usual.append(1) or same_rows(self, c))
    for proposer_class in (Proposer, MatchEveryStep):
        rng = np.random.default_rng(seed)
        if shared:
            answer = rng.integers(100_000, 100_500, 150).astype(np.int32)
            requests = [answering_request(answer, 1000 * (i + 1), rng) for i in range(12)]
        else:
            requests = [copying_request(1000 * (i + 1), length=int(rng.integers(40, 200)), rng=rng)
                        for i in range(8)]
        proposer = proposer_class(vllm_config(k=8))
        ticks = iter(range(10**6))
        proposer.clock = lambda ticks=ticks: 0.01 * next(ticks) ** 1.1  # slower steps: a scale to learn
        engine = run_engine(proposer, requests, slots=3, preempt_every=5 + seed, seed=seed)
        logs.append([(req["base"], draft) for req, draft in engine.draft_log])
    assert sum(map(len, (d for _, d in logs[0]))) > 100
    assert len(usual) > len(logs[0]) // 6  # most steps took the usual path
    assert logs[0] == logs[1]


def test_steps_call_the_kernels_with_the_types_they_were_warmed_for():
    """The proposer compiles (or loads) its kernels at construction; a step that passed, say, a
    strided view would compile another version mid-serving (~0.4 s, or ~4 ms from Numba's
    cache; a refit of the step cost once did). Every version any call made must take
    contiguous arrays."""
    drafting_with(1.0)  # long enough to refit the step cost a few times
    for kernel in (propose_rows, line_scale, match_rows, spot_check, find_slot):
        for signature in kernel.signatures:
            layouts = [t.layout for t in signature if isinstance(t, types.Array)]
            assert set(layouts) <= {"C"}, (kernel.__name__, signature)


class WideningEngine(FakeEngine):
    """Hands the proposer int64 token ids from its 8th step on (vLLM's are int32)."""

    steps = 0

    def step(self):
        self.steps += 1
        if self.steps == 8:
            self.tokens = self.tokens.astype(np.int64)
        super().step()


def test_token_ids_of_another_dtype_are_read_as_their_own():
    """The proposer calls propose_rows' compiled entry point directly, skipping the typing of
    its 26 arguments each step; token ids that change dtype mid-serving must get the entry for
    their own type (read as the old one's, they would be other tokens and other drafts)."""
    logs = []
    for engine_class in (FakeEngine, WideningEngine):
        rng = np.random.default_rng(5)
        requests = [copying_request(1000 * (i + 1), length=120, rng=rng) for i in range(6)]
        proposer = Proposer(vllm_config(k=8))
        ticks = iter(range(10**6))
        proposer.clock = lambda ticks=ticks: 0.01 * next(ticks)  # (the same step costs learned each run)
        engine = run_engine(proposer, requests, slots=3, engine_class=engine_class)
        logs.append([(req["base"], draft) for req, draft in engine.draft_log])
    assert engine.tokens.dtype == np.int64 and sum(map(len, (d for _, d in logs[0]))) > 50
    assert logs[0] == logs[1]


def test_the_entry_point_is_called_with_the_types_it_was_found_for(monkeypatch):
    """propose_rows' entry point is looked up only when vLLM's arrays change type: every other
    argument must keep its type while requests come, finish into the history, are preempted
    and move (an entry point reads an argument of another type as its own)."""
    import numba

    from ngramspec.vllm import proposer as proposer_module

    calls, mismatched = [], []

    def checked_entry_point(kernel, args):
        entry, found_for = proposer_module.compiling.entry_point(kernel, args), [numba.typeof(a) for a in args]

        def call(*args):
            calls.append(1)
            if [numba.typeof(a) for a in args] != found_for:
                mismatched.append([numba.typeof(a) for a in args])
            return entry(*args)

        return call

    monkeypatch.setattr(proposer_module, "entry_point", checked_entry_point)
    proposer = Proposer(vllm_config(k=8, max_num_seqs=4))
    proposer.sessions.max_idle = 2  # slots evicted too
    rng = np.random.default_rng(11)
    engine = run_engine(proposer, [copying_request(1000 * (i + 1), length=60, rng=rng) for i in range(16)], slots=4,
                        preempt_every=7)
    assert len(calls) > 100 and proposer.speculator.history.index.length > 0 and proposer.sessions.created >= 16
    assert mismatched == [] and proposer.failures == 0
    assert sum(map(len, (d for _, d in engine.draft_log))) > 50


NO_COMPILE_RUN = """
import numpy as np
from numba.core.dispatcher import Dispatcher
from test_vllm_proposer import Proposer, copying_request, run_engine, vllm_config

proposer = Proposer(vllm_config(k=4, max_num_seqs=4))
proposer.sessions.max_idle = 2
compiled, compile_for_args, compile = [], Dispatcher._compile_for_args, Dispatcher.compile
Dispatcher._compile_for_args = lambda self, *a, **k: compiled.append(self.py_func.__name__) or compile_for_args(
    self, *a, **k)
def looked_up(self, sig):  # an entry point looked up: compiled (or loaded) only where it is new
    if tuple(sig) not in self.overloads:
        compiled.append(self.py_func.__name__)
    return compile(self, sig)
Dispatcher.compile = looked_up
rng = np.random.default_rng(7)
run_engine(proposer, [copying_request(1000 + 100 * i, length=40, rng=rng) for i in range(12)], slots=4)
assert proposer.sessions.created == 12 and proposer.speculator.history.index.length > 0
print(compiled)
"""


def test_no_engine_step_compiles_anything():
    """Everything a step calls is compiled (or loaded from Numba's cache) at construction:
    requests come, finish into the history, go idle and are evicted, and no step compiles a
    kernel, nor one of the typed list's own accessors (~0.2 s each, once per process: hence a
    fresh process, where no other test compiled them first)."""
    done = subprocess.run([sys.executable, "-c", NO_COMPILE_RUN], cwd=Path(__file__).parent, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_warm_up_leaves_no_evidence_in_the_pool():
    """The scratch steps that compile the kernels draft and learn on a scratch row: none of
    it may reach the acceptance evidence pooled over the engine's requests."""
    proposer = Proposer(vllm_config(k=4))
    assert not proposer.speculator.pool.any()


def test_the_proposer_writes_what_it_learned_where_asked(monkeypatch, tmp_path):
    """NGRAMSPEC_VLLM_STATS names a file the proposer rewrites every STATS_EVERY steps: the
    only view of its learned step cost from outside vLLM's worker process."""
    import json

    import ngramspec.vllm.proposer as vllm_module

    path = tmp_path / "stats.json"
    monkeypatch.setenv(vllm_module.STATS_FILE_ENV, str(path))
    monkeypatch.setattr(vllm_module, "STATS_EVERY", 16)
    proposer, _ = drafting_with(2.5)
    stats = json.loads(path.read_text())
    assert stats["steps"] % 16 == 0 and 0 <= proposer.steps - stats["steps"] < 16
    assert stats["failures"] == 0 and 0 < stats["drafted_tokens"] <= proposer.drafted_tokens
    proposer.write_stats(str(path))
    now = json.loads(path.read_text())  # and its own time inside propose(), per step (0 on this fake clock)
    assert now["steps"] == proposer.steps and proposer.propose_seconds >= 0
    assert now["propose_ms_per_step"] == round(1e3 * proposer.propose_seconds / proposer.steps, 4)
    (six_rows,) = [scale for key, scale in stats["step_scale"].items() if key.startswith("6x")]
    assert six_rows > 1  # 6 rows: positions cost 2.5x what the prior says, learned

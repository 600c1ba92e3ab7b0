"""The GPU path (skipped without CUDA; `eval/gpu_check.sh` runs it on a GPU machine).

The same exactness checks as on CPU with the model and every tensor on the device (the n-gram
index stays on the host), and the host-device sync budget: one sync per decode step, the one
that reads the target's choices. float64 tiny models keep greedy comparisons free of ties.
"""

import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import ngramspec
from ngramspec import NgramSpeculator
from ngramspec.hf.target import left_pad

from conftest import PROCESSOR_CASES, plain_generate, tiny_llama
from test_batch import PAD, repetitive_rows
from test_exact_tiny import random_prompt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FLAT = ((1, 1.0), (512, 1.0))  # drafting always pays: every step verifies a draft


@pytest.fixture(scope="module")
def cuda_model():
    return tiny_llama().to("cuda")


def recording_sessions(spec: NgramSpeculator) -> list:
    """Make ``spec`` keep every session that generate() starts (to inspect the host index)."""
    sessions, start = [], spec.start
    spec.start = lambda *args, **kwargs: sessions.append(start(*args, **kwargs)) or sessions[-1]
    return sessions


@pytest.mark.parametrize("seed", range(4))
def test_greedy_rows_equal_plain_on_cuda(cuda_model, seed):
    rng = np.random.default_rng(seed)
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    sessions, accepted = recording_sessions(spec), 0
    for _ in range(3):
        ids = random_prompt(rng, cuda_model.config.vocab_size, int(rng.integers(2, 60))).cuda()
        max_new = int(rng.integers(1, 80))
        got = cuda_model.generate(ids, max_new_tokens=max_new, ngram_speculator=spec)
        assert got.device.type == "cuda"
        assert got.tolist() == plain_generate(cuda_model, ids, max_new_tokens=max_new).tolist()
        # The index lives on the host and holds exactly the returned sequence (prompt + every
        # emitted token): the device choices reached it, and nothing else did.
        stream = sessions[-1].tokens
        assert type(stream) is np.ndarray and stream.dtype == np.int32
        assert stream.tolist() == got[0].tolist()
        accepted += spec.last_stats.accepted_tokens
    assert len(sessions) == 3 and accepted > 0, "no draft was accepted: verification went untested"


@pytest.mark.parametrize("processor_kwargs", PROCESSOR_CASES)
def test_processors_on_cuda(cuda_model, processor_kwargs):
    ids = random_prompt(np.random.default_rng(3), cuda_model.config.vocab_size, 40).cuda()
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    got = cuda_model.generate(ids, max_new_tokens=60, ngram_speculator=spec, **processor_kwargs)
    assert got.tolist() == plain_generate(cuda_model, ids, max_new_tokens=60, **processor_kwargs).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_batches_equal_plain_batched_on_cuda(cuda_model, seed):
    rng = np.random.default_rng(seed)
    ids, mask = left_pad(repetitive_rows(rng, 5), PAD)
    ids, mask = ids.cuda(), mask.cuda()
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    got = cuda_model.generate(ids, attention_mask=mask, max_new_tokens=120, eos_token_id=None, ngram_speculator=spec)
    expected = plain_generate(cuda_model, ids, attention_mask=mask, max_new_tokens=120, eos_token_id=None)
    assert got.tolist() == expected.tolist()


def test_token_trees_on_cuda(cuda_model):
    ids = random_prompt(np.random.default_rng(5), cuda_model.config.vocab_size, 50).cuda()
    spec = NgramSpeculator(min_n=1, tree_branches=3, verify_cost=FLAT)
    got = cuda_model.generate(ids, max_new_tokens=80, eos_token_id=None, ngram_speculator=spec)
    assert got.tolist() == plain_generate(cuda_model, ids, max_new_tokens=80, eos_token_id=None).tolist()


def _syncs_and_forwards(model, **kwargs) -> tuple[int, int]:
    """Synchronizing CUDA calls and model forwards during one generate() call."""
    forwards = []
    hook = model.register_forward_pre_hook(lambda *args: forwards.append(1))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(**kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        hook.remove()
    return sum("synchroniz" in str(w.message) for w in caught), len(forwards)


# The syncs ngramspec's design names before the prefill, by the ngramspec function that makes
# them (the innermost frame outside torch): the pad id read once (hook.py), each prompt row copied
# to the host index (proposal.py, once per row), the rows' next positions read (decode.py). After
# that: exactly one per step, the read of the target's choices. tests/test_syncs.py finds the same
# on CPU.
SETUP_SYNCS = {("hook.py", "ngram_generate"): 1, ("proposal.py", "as_token_array"): "rows",
               ("decode.py", "__init__"): 1}
PACKAGE = str(Path(ngramspec.__file__).resolve().parent)
# Frames between the sync and the code that asked for it: torch's, and the tests' (a CPU
# emulation of this log raises the warnings from tests/test_syncs.py's counter).
SKIPPED = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parent))


def _sync_log(model, **kwargs) -> tuple[list[tuple[int, bool, tuple[str, str] | None]], int]:
    """One generate() call's synchronizing CUDA calls, each as (forward index: -1 before the
    prefill, inside a forward, (file, function) of the innermost frame outside torch when that
    frame is ngramspec's, else None); and the number of forwards."""
    log, state = [], {"forward": -1, "inside": False}

    def before(*args):
        state["forward"] += 1
        state["inside"] = True

    def after(*args):
        state["inside"] = False

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frame = next((f for f in reversed(traceback.extract_stack()[:-1]) if not f.filename.startswith(SKIPPED)
                      and not f.filename.endswith("warnings.py")), None)
        ours = (Path(frame.filename).name, frame.name) if frame and frame.filename.startswith(PACKAGE) else None
        log.append((state["forward"], state["inside"], ours))

    hooks = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record  # catch_warnings puts the original back
            model.generate(**kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        for hook in hooks:
            hook.remove()
    return log, state["forward"] + 1


@pytest.mark.parametrize("extra", [{}, dict(repetition_penalty=1.3), dict(do_sample=True, top_k=5),
                                   dict(do_sample=True, top_p=0.9, temperature=0.7),
                                   dict(do_sample=True, top_k=8, repetition_penalty=1.3)])
@pytest.mark.parametrize("branches", [1, 3])
def test_one_sync_per_step(cuda_model, extra, branches):
    """Between one forward and the next (and after the last), ngramspec syncs exactly once: the
    read of the target's choices. Before the prefill it makes only the syncs SETUP_SYNCS names,
    and the model's own (inside its forwards) and transformers' set-up syncs are no more than
    plain generate()'s. Chains and token trees. (tests/test_syncs.py counts the same on CPU.)"""
    ids = random_prompt(np.random.default_rng(9), cuda_model.config.vocab_size, 40).cuda()
    common = dict(input_ids=ids, max_new_tokens=150, eos_token_id=None, **extra)
    plain, _ = _sync_log(cuda_model, **common)
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT, tree_branches=branches)
    ours, forwards = _sync_log(cuda_model, ngram_speculator=spec, **common)
    assert spec.last_stats.accepted_tokens > 0 and forwards == spec.last_stats.target_forwards
    steps = [sum(1 for f, inside, _ in ours if f == k and not inside) for k in range(forwards)]
    assert steps == [1] * forwards, f"syncs after each forward (one each expected): {steps}"
    setup = Counter(who for f, _, who in ours if f == -1 and who is not None)
    allowed = {k: ids.shape[0] if n == "rows" else n for k, n in SETUP_SYNCS.items()}
    assert all(n <= allowed.get(k, 0) for k, n in setup.items()), f"set-up syncs {dict(setup)}, allowed {allowed}"
    theirs = sum(1 for f, _, who in ours if f == -1 and who is None)
    assert theirs <= sum(1 for f, _, _ in plain if f == -1), "transformers' set-up syncs more than in plain generate()"
    inside = Counter(f for f, inside, _ in ours if inside)
    plain_inside = Counter(f for f, inside, _ in plain if inside)
    assert max(inside.values(), default=0) <= max(plain_inside.values(), default=0), (
        f"the model syncs more inside a verify forward ({dict(inside)}) than plain generate()'s ({dict(plain_inside)})")


def test_online_cost_model_adds_no_sync_and_times_every_forward(cuda_model):
    """The default speculator times every forward with CUDA events read later: every timed
    forward (all but the prefill) reaches the cost model, and the syncs beyond one per forward
    are those of a fixed cost curve (no timer): timing adds none."""
    ids = random_prompt(np.random.default_rng(9), cuda_model.config.vocab_size, 40).cuda()
    common = dict(input_ids=ids, max_new_tokens=150, eos_token_id=None)
    fixed_syncs, fixed_forwards = _syncs_and_forwards(
        cuda_model, ngram_speculator=NgramSpeculator(min_n=1, verify_cost=FLAT), **common)
    spec = NgramSpeculator(min_n=1)  # verify_cost=None: the online cost model
    syncs, forwards = _syncs_and_forwards(cuda_model, ngram_speculator=spec, **common)
    assert spec.cost_model.observations == forwards - 1, f"{spec.cost_model.observations} timings, {forwards} forwards"
    assert syncs - forwards <= fixed_syncs - fixed_forwards, (
        f"online: {syncs} syncs over {forwards} forwards; fixed curve: {fixed_syncs} over {fixed_forwards}")

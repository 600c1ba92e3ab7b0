"""A fresh install's first request (issue 51, item 3): building an NgramSpeculator compiles every
kernel a transformers ``generate()`` calls, so the generate itself compiles nothing; a second
process loads them all from Numba's cache and compiles none; both decode the same tokens.
No timings: what is checked is which kernels Numba compiles in which process (its compile
events), in two fresh interpreters sharing one empty cache folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

# Each child records Numba's compile events for ngramspec's kernels, by phase (Numba's own
# helpers, such as a typed list's constructor, compile in every process and are left out).
LISTENER = """
import json
from numba.core import event

phase, compiled = ["start"], {"start": [], "speculator": [], "generate": []}

class Listener(event.Listener):
    def on_start(self, e):
        pass

    def on_end(self, e):
        function = getattr((e.data or {}).get("dispatcher"), "py_func", None)
        if function is not None and function.__module__.startswith("ngramspec"):
            compiled[phase[0]].append(function.__qualname__)

event.register("numba:compile", Listener())
"""

CHILD = LISTENER + """
import torch
import ngramspec
from eval.coldstart import TEXT, _tiny_model

model = _tiny_model()
ngramspec.install()
ids = torch.tensor([[1] + [3 + b for b in TEXT.encode()] * 2])
phase[0] = "speculator"
speculator = ngramspec.NgramSpeculator(payoff_sizing=False)  # drafts that no timing changes
phase[0] = "generate"
out = model.generate(ids, ngram_speculator=speculator, do_sample=False, max_new_tokens=24, min_new_tokens=24)
print(json.dumps({"compiled": compiled, "output": out[0].tolist(),
                  "drafted": speculator.last_stats.drafted_tokens}))
"""


def _child(cache: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_speculator_compiles_what_generate_needs_and_a_second_process_loads_it(tmp_path):
    cold = _child(tmp_path)
    assert "propose_slot" in cold["compiled"]["speculator"] and "extend_slot" in cold["compiled"]["speculator"]
    assert cold["compiled"]["generate"] == []  # the warm-up covered every kernel the request calls
    # Not compiled for a transformers request: vLLM's rows and the flattened sizing (its
    # proposer warms those), nor the n-gram index from Python (only a history calls it there).
    assert not {"draft_rows", "flattened_lengths", "_by_gain"} & set(cold["compiled"]["speculator"])
    warm = _child(tmp_path)
    assert warm["compiled"] == {"start": [], "speculator": [], "generate": []}
    # The same drafts (unsized) over the same weights: the same forwards, so the same tokens.
    assert warm["output"] == cold["output"] and cold["drafted"] == warm["drafted"]


BACKGROUND_CHILD = LISTENER + """
import torch
import ngramspec
from ngramspec.draft import compiling
from conftest import tiny_llama  # peaked weights: repetitive greedy text, so drafts are accepted

model = tiny_llama()
ids = torch.tensor([[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
speculator = ngramspec.NgramSpeculator(payoff_sizing=False)
ready_at_once = compiling.ready()
runs = []
for _ in range(2):
    out = model.generate(ids, ngram_speculator=speculator, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    stats = speculator.last_stats
    runs.append({"output": out[0].tolist(), "compiling_steps": stats.compiling_steps, "drafted": stats.drafted_tokens,
                 "forwards": stats.target_forwards})
    compiling.wait()  # the second process ends: the second generate drafts
plain = model.generate(ids, do_sample=False, max_new_tokens=24, min_new_tokens=24)[0].tolist()
print(json.dumps({"compiled": sum(compiled.values(), []), "ready_at_once": ready_at_once, "runs": runs,
                  "plain": plain}))
"""


def test_a_fresh_install_compiles_in_a_second_process_while_requests_decode(tmp_path):
    """NGRAMSPEC_COMPILE=background (the default outside tests) on an empty cache: the speculator
    returns before the kernels are ready, having compiled only the probe kernel here; the first
    generate takes plain steps and says so (compiling_steps), with the plain output; once the
    second process has ended, a generate drafts, and a new process finds every kernel cached."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
           "HF_HUB_OFFLINE": "1", "NGRAMSPEC_COMPILE": "background"}
    done = subprocess.run([sys.executable, "-c", BACKGROUND_CHILD], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiling the drafting kernels in a second process" in done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert not child["ready_at_once"]
    first, second = child["runs"]
    assert first["output"] == second["output"] == child["plain"]
    # The tiny model's 24 tokens end long before ~8 s of compiling: every step a plain one.
    assert first["drafted"] == 0 and first["compiling_steps"] == first["forwards"] - 1 == 23
    assert second["compiling_steps"] == 0 and second["drafted"] > 0
    # This process compiled the probe (padded_lengths) and loaded the rest from the cache the
    # second process wrote (a typed list's helpers aside, which no process caches).
    assert set(child["compiled"]) == {"padded_lengths"}
    warm = _child(tmp_path)
    assert warm["compiled"] == {"start": [], "speculator": [], "generate": []}


def test_a_request_drafts_from_the_first_step_after_the_kernels_are_ready(tiny_model, monkeypatch):
    """A request that starts while the kernels compile turns into a real session mid-way: the
    second process stands in as a fake that runs for 5 more polls (one when the request starts,
    one per step after): the output is plain greedy's, 4 steps are plain ones, then it drafts."""
    from ngramspec import NgramSpeculator
    from ngramspec.draft import compiling

    class Compiling:
        polls = 0

        def poll(self):
            self.polls += 1
            return None if self.polls <= 5 else 0

    speculator = NgramSpeculator(payoff_sizing=False)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    monkeypatch.setattr(compiling, "_ready", False)
    monkeypatch.setattr(compiling, "_compiler", Compiling())
    out = tiny_model.generate(ids, ngram_speculator=speculator, do_sample=False, max_new_tokens=20,
                              min_new_tokens=20)
    stats = speculator.last_stats
    plain = tiny_model.generate(ids, do_sample=False, max_new_tokens=20, min_new_tokens=20)
    assert out.tolist() == plain.tolist()
    assert stats.compiling_steps == 4 and stats.accepted_tokens > 0 and compiling._ready

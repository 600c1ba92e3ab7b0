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

REPO = Path(__file__).resolve().parent.parent

# The child: Numba's compile events, by phase, for ngramspec's kernels (Numba's own helpers,
# such as a typed list's constructor, compile in every process and are left out).
CHILD = """
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

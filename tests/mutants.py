"""Mutation check of the test suite: each known bug is planted in the source, the tests that
must catch it run, the source is restored; every mutant must make them fail.

    python tests/mutants.py            # all mutants (about 2 minutes on 2 cores)
    python tests/mutants.py crop       # one

The decode-loop mutants (a wrong crop, unmasked holes, positions that count holes, the wrong
tree columns, no crop after a stop) must fail tests/test_decode.py; a sampler that draws again
from p after a rejection (so the draft token gets extra mass) must fail tests/test_sampling.py.
Sessions that propose nothing, and drafts that are all wrong, leave every output exact: they
must fail each exactness file (test_generate_hook, test_batch, test_decode, test_sampling,
test_exact_tiny), whose tests assert accepted drafts or say why none can be accepted.
A mutant counts as caught only when a test fails (pytest's exit status 1 with at least one
FAILED test and no collection error): a collection error, an interrupted run, a usage error or
no tests collected (exit status 2-5, or 1 with a collection error, which is what pytest-xdist
gives for one) is reported as BROKEN, a mutant that proves nothing. Exit status 1 when a mutant
survives or is broken.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODE, VERIFY, WALK = "ngramspec/hf/decode.py", "ngramspec/hf/verify.py", "ngramspec/draft/walk.py"
FORWARD = "        logits = target.forward(ids, positions, mask, ids.shape[1], visible)  # (A, q, V)\n"
RETURN_DRAFTS = "        self.propose_seconds += self._last_end - started\n        return drafts\n"
EXACTNESS = ("tests/test_generate_hook.py tests/test_batch.py tests/test_decode.py tests/test_sampling.py "
             "tests/test_exact_tiny.py -m 'not real_model and not slow'")
# name: (file, original text, mutated text, tests that must fail), or (file, [(original, mutated) or
# (another file, original, mutated), ...], tests that must fail)
MUTANTS = {
    # 16-bit requests that go unwarned: float16 forgotten, or eager attention taken as a guarantee.
    "16-bit unwarned": ("ngramspec/hf/checks.py", "if (dtype not in (torch.bfloat16, torch.float16) or",
                        "if (dtype not in (torch.bfloat16,) or", "tests/test_architectures.py"),
    # An encoder-decoder's drafter without its source, or a row decoded with another row's encoder outputs.
    "seq2seq source dropped": ("ngramspec/hf/seq2seq.py", "        if self.source_ids is None:\n",
                               "        if True:\n", "tests/test_seq2seq.py"),
    "seq2seq wrong row": ("ngramspec/hf/seq2seq.py", "        if batch == 1:\n", "        if True:\n",
                          "tests/test_seq2seq.py"),
    # Shallow drafts drafted whether or not they pay (the sizing rule's answer ignored).
    "shallow unsized": ("ngramspec/hf/shallow.py", "limit = self.evidence.length(self.cost_model, context, limit)\n",
                        "limit = limit\n", "tests/test_self_draft.py"),
    "crop": (DECODE, "else q - width + cut)\n", "else max(q - width - 1, 0) + cut)\n", "tests/test_decode.py"),
    "hole masking": (DECODE, "            self.mask = torch.cat([self.mask, step], 1)\n",
                     "            self.mask = torch.cat([self.mask, torch.ones_like(step)], 1)\n",
                     "tests/test_decode.py"),
    "positions": (DECODE, "        self.next_position = [p + n + 1 for p, n in zip(self.next_position, kept)]\n",
                  "        self.next_position = [p + width for p in self.next_position]\n", "tests/test_decode.py"),
    "tree gather": (DECODE, "            rows = verify.block_rows(verdicts[0].path)\n",
                    "            rows = list(range(len(verdicts[0].path) + 1))\n", "tests/test_decode.py"),
    "stop crop": (DECODE, "        cut = rows.cut if batch == 1 and not still else 0\n", "        cut = 0\n",
                  "tests/test_decode.py"),
    # The package __init__ importing hf/ eagerly again: `import ngramspec.draft` loads torch.
    "eager import": ("ngramspec/__init__.py", "\nif TYPE_CHECKING:",
                     "\nfrom .hf import hook  # noqa: E402,F401\n\nif TYPE_CHECKING:", "tests/test_layers.py"),
    # A sub-config's default that the README no longer states: the config's default differs from
    # the class's own (the table says `CostModelTuning()`), or a nested default moved
    # (`cost_tuning.window=15`): tests/test_readme.py compares both.
    "readme sub-config": ("ngramspec/draft/config.py", "    cost_tuning: CostModelTuning = CostModelTuning()\n",
                          "    cost_tuning: CostModelTuning = CostModelTuning(window=16)\n", "tests/test_readme.py"),
    "readme nested default": ("ngramspec/cost/costmodel.py", "    window: int = 15\n", "    window: int = 16\n",
                              "tests/test_readme.py"),
    # The loop stop blind to periods over 8 tokens (a looping sentence goes on): only the property
    # test's examples have such loops, and only when they reach its "fires" branch.
    "loop stop short periods": ("ngramspec/app/guard.py", "range(1, min(self.max_period, n - 1) + 1)",
                                "range(1, min(8, n - 1) + 1)", "tests/test_guard.py"),
    # Exactness that proves nothing: identical output with no draft accepted. Sessions that propose
    # nothing (every step a plain step), and drafts that are all wrong (the walk finds no draft
    # token among the target's choices: every draft is rejected at its first token). Every
    # exactness test must assert accepted drafts, so both must fail each of these files.
    "no drafts": ("ngramspec/draft/session.py", "        if count == 0:\n", "        if True:  # propose nothing\n",
                  EXACTNESS),
    "all wrong drafts": (WALK, [
        ("        children = {(i - 1, int(token)): i for i, token in enumerate(draft)}\n",
         "        children = {(i - 1, -1 - int(token)): i for i, token in enumerate(draft)}\n"),
        ("        children = {(int(parent), int(token)): i for",
         "        children = {(int(parent), -1 - int(token)): i for"),
    ], EXACTNESS),
    # A host-device wait in every step beyond the one that reads the target's choices, of each
    # kind tests/test_syncs.py must see: boolean-mask indexing, nonzero, torch.equal (each reads
    # the device to size or decide its result) and a CUDA event waited on.
    "sync mask index": (DECODE, FORWARD, FORWARD + "        logits[logits > 1e9]  # a boolean mask: a wait\n",
                        "tests/test_syncs.py"),
    "sync nonzero": (DECODE, FORWARD, FORWARD + "        torch.nonzero(logits > 1e9)  # a wait\n",
                     "tests/test_syncs.py"),
    "sync equal": (DECODE, FORWARD, FORWARD + "        torch.equal(logits, logits)  # a wait\n", "tests/test_syncs.py"),
    "sync event": ("ngramspec/cost/timer.py", "            end.record()\n",
                   "            end.record()\n            end.synchronize()  # a wait\n", "tests/test_syncs.py"),
    # The fuzzer passing any exception of the type plain generate() raises, whatever its message.
    "fuzz error type only": ("tests/fuzz.py", "if type(ours) is type(plain) and str(ours) == str(plain):",
                             "if type(ours) is type(plain):", "tests/test_fuzz.py -m 'not slow'"),
    # The vLLM drafter handing each row the next row's draft (the fake engine's tests catch it).
    "vllm rows": ("ngramspec/vllm/proposer.py", RETURN_DRAFTS,
                  RETURN_DRAFTS.replace("drafts\n", "drafts[1:] + drafts[:1]\n"),
                  "tests/test_vllm_proposer.py"),
    # The same inside a real vLLM engine (needs .venv-vllm): drafts copied from another row's
    # document. One process (-n 0): the test's engine starts once.
    "vllm rows in the engine": ("ngramspec/vllm/proposer.py", RETURN_DRAFTS,
                                RETURN_DRAFTS.replace("drafts\n", "drafts[1:] + drafts[:1]\n"),
                                "tests/with_vllm/test_vllm_drafts.py -n 0"),
    # A sampler that, after a rejection, draws the position again with a fresh uniform (so the
    # draft token gets extra mass): the redraw in follow(), and uniforms no longer fixed per
    # position (else the redraw would repeat the same draw).
    "biased sampler": (VERIFY, [
        (WALK, "        node = children.get((node, token), None)\n        if node is None:\n",
         "        previous, node = node, children.get((node, token), None)\n        if node is None:\n"
         "            if any(parent == previous for parent, _ in children):  # rejected: draw again\n"
         "                emitted[-1] = choice(previous + 1, emitted[:-1])\n"),
        ("        drawn = self.drawn[b]\n",
         "        return torch.rand((), dtype=torch.float64).item()\n        drawn = self.drawn[b]\n"),
    ], "tests/test_sampling.py"),
    # The GPU check (issue 50): a requirement check that passes what the image lacks; a
    # description's unread version taken as too old to meet anything (the resolver would carry
    # what the image has); a benchmark silent until its first batch ends; a CPU benchmark that
    # keeps every core's thread while other processes keep them busy.
    "gpu check passes anything": ("eval/gpu_payload.py", "        if not requirement.specifier.contains(found, "
                                  "prereleases=True):\n", "        if False:\n", "tests/test_gpu_payload.py"),
    "gpu unread version": ("eval/gpu_payload.py", 'version = dist["version"] or UNREAD_VERSION',
                           'version = dist["version"] or "0"', "tests/test_gpu_payload.py"),
    "bench silent per method": ("eval/bench.py", "                if on_batch is not None:  # something on screen",
                                "                if False:  # something on screen", "tests/test_eval.py -k bench"),
    "bench threads under load": ("eval/bench.py", "threads_for_busy_cores(torch.get_num_threads()) if on_cpu else None",
                                 "None", "tests/test_eval.py -k bench"),
    # A fresh install's kernels (issue 51): a request that never drafts once they are ready, and a
    # speculator that compiles them before it returns (a first request waits ~8 s).
    "pending forever": ("ngramspec/draft/compiling.py", "        if self._session is None and ready():\n",
                        "        if False:\n", "tests/test_coldstart.py"),
    "compile first": ("ngramspec/draft/compiling.py",
                      'os.environ.get("NGRAMSPEC_COMPILE", "background") == "foreground"', "True",
                      "tests/test_coldstart.py"),
    # A request's calibration of the pool (issue 51): gone, raising the pool too, or never fading.
    "uncalibrated": ("ngramspec/draft/acceptance.py", "        borrowed *= calibration\n", "",
                     "tests/test_acceptance.py tests/test_drafting.py"),
    "calibration raises": ("ngramspec/draft/acceptance.py", "calibration = min(1.0, ", "calibration = max(0.0, ",
                           "tests/test_acceptance.py"),
    "calibration unfaded": ("ngramspec/draft/acceptance.py", "    own[CALIBRATION, PREDICTED] *= memory\n", "",
                            "tests/test_acceptance.py"),
    # Engine steps filed in raw seconds: a window of draining rows fits their plain steps' spread.
    "steps unnormalized": ("ngramspec/cost/steps.py", "[step[3] / plain for step in run]", "[step[3] for step in run]",
                           "tests/test_costmodel.py"),
    # The index's single occurrences (issue 51: memory): no promotion when a suffix recurs, or a
    # query that stops at a single n-gram instead of comparing the longer ones there.
    "no promotion": ("ngramspec/draft/index.py",
                     "                _insert(tokens, once, n + 1, _key_at(tokens, once, n + 1), slots)\n",
                     "                pass\n", "tests/test_index.py"),
    "single not extended": ("ngramspec/draft/index.py",
                            "            best_n = _longer_at(tokens, _last(slot), key, n, top)\n",
                            "            pass\n", "tests/test_index.py"),
}


def run(name: str) -> bool:
    """True when the mutant is caught (a test of each test file it names fails)."""
    path, *change, tests = MUTANTS[name]
    replacements = change[0] if len(change) == 1 else [tuple(change)]  # one (original, mutated) or a list
    sources: dict[Path, str] = {}  # every file changed, as it was
    try:
        for replacement in replacements:
            file, original, mutated = replacement if len(replacement) == 3 else (path, *replacement)
            source_file = ROOT / file
            mutant = source_file.read_text()
            sources.setdefault(source_file, mutant)
            assert mutant.count(original) == 1, f"{name}: the original text is not in {file} exactly once"
            source_file.write_text(mutant.replace(original, mutated))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-n", "auto", "-p", "no:cacheprovider",
                               *shlex.split(tests)], cwd=ROOT, capture_output=True, text=True)
    finally:
        for source_file, source in sources.items():
            source_file.write_text(source)
    summary = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line or " error" in line]
    result = verdict(done.returncode, done.stdout, tuple(a for a in shlex.split(tests) if a.endswith(".py")))
    print(f"{name}: {result} ({summary[-1] if summary else 'no summary'})")
    for line in done.stdout.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            print("   ", line.split(" - ")[0])
    return result == "caught"


def verdict(returncode: int, stdout: str, files: tuple[str, ...] = ()) -> str:
    """"caught" only when a test failed (exit status 1, a FAILED line, no collection error) in
    each of ``files`` (the test files the mutant names); "SURVIVED" when every test passed, or
    when some named file had no failure ("SURVIVED in FILE"); else "BROKEN (...)": the run
    proved nothing."""
    lines = stdout.splitlines()
    collection_error = any("ERROR collecting" in line or "during collection" in line for line in lines)
    failed = [line for line in lines if line.startswith("FAILED ")]
    if returncode == 1 and failed and not collection_error:
        passing = [f for f in files if not any(line.startswith(f"FAILED {f}::") for line in failed)]
        return f"SURVIVED in {' '.join(passing)}" if passing else "caught"
    if returncode == 0:
        return "SURVIVED"
    return f"BROKEN (pytest exit status {returncode}{', a collection error' if collection_error else ''})"


def needs_missing_vllm(name: str) -> bool:
    """A mutant whose tests run only inside vLLM (tests/with_vllm), where vLLM is not installed
    (run it with .venv-vllm/bin/python)."""
    import importlib.util

    return "tests/with_vllm/" in MUTANTS[name][-1] and importlib.util.find_spec("vllm") is None


if __name__ == "__main__":
    names = sys.argv[1:] or list(MUTANTS)
    for name in [n for n in names if needs_missing_vllm(n)]:
        print(f"{name}: not run (its tests need vLLM: .venv-vllm/bin/python tests/mutants.py {name!r})")
        names.remove(name)
    sys.exit(0 if all([run(name) for name in names]) else 1)

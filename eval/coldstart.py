"""`python -m eval coldstart`: what a fresh install's first request pays for compiling the
drafting kernels.

Each round runs two fresh processes on one empty Numba cache folder (``NUMBA_CACHE_DIR``, which
Numba reads instead of the ``__pycache__`` folders beside the sources): the *cold* one compiles
every kernel and writes the cache, the *warm* one loads it, as every later process does. Each
process times, from its start, importing ngramspec, loading the model, then building an
``NgramSpeculator`` and running one ``generate()`` (greedy, ``--max-new-tokens``) on a
copy-heavy prompt; ``first`` is the speculator plus that generate, ``total`` the whole process up
to its end, which waits for a second process still compiling (``--compile background``, the
default: :mod:`ngramspec.draft.compiling`), so the warm side finds a whole cache. The report
gives each side's best of ``--rounds`` and cold minus warm, for both.

``--model tiny``: a random 2-layer llama built from a config (no download, a 49,152-token
vocabulary like the default's) instead of the default SmolLM2-135M-Instruct; its forwards take
next to nothing, so the difference is the drafter's start alone. Never a timed test: the numbers
depend on the machine and on what else it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("def load(path):\n    with open(path) as f:\n        return json.load(f)\n\n"
        "def save(path, data):\n    with open(path, 'w') as f:\n        json.dump(data, f)\n\n"
        "def merge(a, b):\n    out = dict(a)\n    out.update(b)\n    return out\n")


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny' or a path")
    parser.add_argument("--rounds", type=int, default=2, help="cold-then-warm pairs; each side reports its best")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the children (0: torch's choice)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one process may take")
    parser.add_argument("--out", default=None, help="file for the JSON result")
    parser.add_argument("--compile", choices=("background", "foreground"), default="background",
                        help="how a cold process compiles the kernels (NGRAMSPEC_COMPILE): a second process while "
                             "requests decode without drafts (the default), or before the speculator returns")


def _tiny_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49_152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def child(model_name: str, max_new_tokens: int, threads: int) -> dict:
    """One process's timings (seconds since it started), printed as one JSON line by ``main``."""
    start = time.perf_counter()
    import torch

    if threads:
        torch.set_num_threads(threads)
    import ngramspec

    imported = time.perf_counter()
    if model_name == "tiny":
        model = _tiny_model()
        ngramspec.install()
        ids = torch.tensor([[1] + [3 + (b % 4000) for b in TEXT.encode()] * 3])
    else:
        model, tokenizer = ngramspec.load_model(model_name)
        messages = [{"role": "user", "content": "Repeat this code exactly:\n\n" + TEXT}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = ids["input_ids"]
    loaded = time.perf_counter()
    speculator = ngramspec.NgramSpeculator()
    with torch.inference_mode():
        out = model.generate(ids, ngram_speculator=speculator, do_sample=False, max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens)
    done = time.perf_counter()
    from ngramspec.draft import compiling

    compiling.wait()  # a cold process's second one, so the next process finds a whole cache
    stats = speculator.last_stats
    return {"import": imported - start, "load": loaded - imported, "first": done - loaded,
            "total": time.perf_counter() - start, "tokens": int(out.shape[1] - ids.shape[1]),
            "threads": torch.get_num_threads(), "compiling_steps": stats.compiling_steps,
            "drafted": stats.drafted_tokens, "output": out[0, ids.shape[1]:].tolist()}


def _run(cache: str, args) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "HF_HUB_OFFLINE": "1", "NGRAMSPEC_COMPILE": args.compile,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = ("import json, sys; from eval.coldstart import child; "
            f"print(json.dumps(child({args.model!r}, {args.max_new_tokens}, {args.threads})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=args.timeout)
    if done.returncode:
        raise RuntimeError(f"the child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(args) -> int:
    sides = {"cold": [], "warm": []}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
            for side in ("cold", "warm"):
                result = _run(cache, args)
                sides[side].append(result)
                print(f"round {r + 1} {side}: first {result['first']:.2f} s, total {result['total']:.2f} s "
                      f"(import {result['import']:.2f}, load {result['load']:.2f}; {result['tokens']} tokens, "
                      f"{result['compiling_steps']} steps while compiling, {result['drafted']} drafted, "
                      f"{result['threads']} torch threads)", flush=True)
    outputs = {tuple(run["output"]) for runs in sides.values() for run in runs}
    best = {side: {key: min(run[key] for run in runs) for key in ("first", "total")} for side, runs in sides.items()}
    report = {"model": args.model, "compile": args.compile, "max_new_tokens": args.max_new_tokens,
              "threads": sides["cold"][0]["threads"],
              "best": best, "cold_minus_warm": {k: best["cold"][k] - best["warm"][k] for k in ("first", "total")},
              "same_output": len(outputs) == 1, "runs": {s: [{k: v for k, v in run.items() if k != "output"}
                                                              for run in runs] for s, runs in sides.items()}}
    print(f"best of {args.rounds}: first generate cold {best['cold']['first']:.2f} s, "
          f"warm {best['warm']['first']:.2f} s -> cold is {report['cold_minus_warm']['first']:.2f} s slower "
          f"(whole process: "
          f"{report['cold_minus_warm']['total']:.2f} s); outputs identical: {report['same_output']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0

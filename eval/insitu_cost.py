"""Verify cost inside real decoding: forward time per verify size q, relative to greedy's step.

    python -m eval insitu-cost --tasks humanevalfix,quixbugs,editeval_instructcoder,jfleg --limit 3

Runs each item with plain greedy and with ngramspec (default settings, 256 new tokens), times
every model forward with hooks, and prints the median forward time for each q that ngramspec
verified, relative to the median one-token forward of greedy decoding on the same items. A
check of the isolated measurement of ``python -m eval cost-curve`` (which the default curve comes from).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch

import ngramspec
import tasks
from ngramspec import NgramSpeculator

from .options import add_options


def add_arguments(parser) -> None:
    add_options(parser, "model", "tasks", "limit", "max_new_tokens", "data_dir", "threads",
                tasks={"default": "humanevalfix,quixbugs,editeval_instructcoder,jfleg"}, limit={"default": 3},
                threads={"default": 2})


def main(args) -> int:
    names = args.tasks
    torch.set_num_threads(args.threads)
    model, tokenizer = ngramspec.load_model(args.model)
    times = {"greedy": defaultdict(list), "ngramspec": defaultdict(list)}
    now = {"method": "greedy", "q": 0, "start": 0.0, "prefill": True}

    def before(module, call_args, kwargs):
        now["q"], now["start"] = kwargs["input_ids"].shape[1], time.perf_counter()

    def after(module, call_args, kwargs, output):
        if not now["prefill"]:  # the prompt's forward is no verify step
            times[now["method"]][now["q"]].append(time.perf_counter() - now["start"])
        now["prefill"] = False

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    spec = NgramSpeculator()
    for name in names:
        for item in tasks.load_items(name, data_dir=args.data_dir, limit=args.limit):
            ids = torch.tensor([tasks.prompt_ids(tokenizer, item)])
            for method in ("greedy", "ngramspec"):
                now["method"], now["prefill"] = method, True
                extra = {"ngram_speculator": spec} if method == "ngramspec" else {}
                model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, **extra)
    base = statistics.median(times["greedy"][1])
    print(f"torch threads {torch.get_num_threads()}: greedy one-token forward median {base * 1e3:.2f} ms "
          f"over {len(times['greedy'][1])} steps")
    for q in sorted(times["ngramspec"]):
        t = times["ngramspec"][q]
        print(f"  q={q:3d}  steps {len(t):5d}  median {statistics.median(t) / base:.2f}x")
    return 0

"""Measure the verify-cost curve: one forward over q tokens relative to one token.

    python -m eval cost-curve --model default --context 400 --threads 2 --repeats 15

Feeds q random tokens on top of a KV cache of ``--context`` tokens, crops them again, and
repeats, interleaving all q values so drift hits them alike. Prints the median ratio per q and a
``verify_cost=`` override for SpeculatorConfig (the default curve was measured this way).
"""

from __future__ import annotations

import torch

import ngramspec
from ngramspec.cost.curves import measure_cost_curve

from .options import add_options, ints


def add_arguments(parser) -> None:
    add_options(parser, "model", "threads", threads={"default": 2})
    parser.add_argument("--context", type=int, default=400, help="tokens already in the KV cache")
    parser.add_argument("--qs", type=ints, default="1,2,3,4,5,6,8,10,12,16",
                        help="comma-separated verify sizes (must include 1)")
    parser.add_argument("--repeats", type=int, default=15)


def main(args) -> int:
    qs = sorted(set(args.qs))
    if qs[0] != 1:
        raise ValueError("--qs must include 1 (the baseline)")
    torch.set_num_threads(args.threads)
    model, _ = ngramspec.load_model(args.model)
    curve = measure_cost_curve(model, args.context, qs, args.repeats)
    base = curve.pop(0)
    print(f"model {args.model}, device {next(model.parameters()).device}, torch threads {torch.get_num_threads()}, "
          f"context {args.context}: one-token forward {base * 1e3:.1f} ms (median of {args.repeats})")
    for q, ratio in curve.items():
        print(f"  q={q:3d}  {ratio:.2f}x")
    print("verify_cost=" + ",".join(f"{q}:{r:.2f}" for q, r in curve.items()))
    return 0

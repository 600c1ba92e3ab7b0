"""Side-by-side wall-clock benchmark: plain greedy vs transformers' prompt lookup vs ngramspec.

    python -m eval.speedup --tasks humanevalfix,quixbugs,editeval_instructcoder,iterater_human \
        --limit 6 --max-new-tokens 256 --threads 2 --out eval/results/core_speedup

Every item runs every method back to back (interleaved, so machine drift hits all methods
alike), after one untimed warm-up item. Reports per set and overall: total tokens / total
seconds, speed-up vs greedy, MAT (tokens per target forward), and whether every output is
token-identical to plain greedy. Also times the drafter (propose + extend) per step at
1k/16k/128k tokens of context. Run it on an otherwise idle machine; the thread count is fixed
and printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ngramspec  # noqa: E402
import tasks  # noqa: E402
from ngramspec import NgramSpeculator, SpeculatorConfig  # noqa: E402

def make_speculators(methods: list[str]) -> dict:
    """``ngramspec`` or ``ngramspec:name=value,...`` -> a speculator per method name."""
    specs = {}
    for method in methods:
        if method.startswith("ngramspec"):
            overrides = method.partition(":")[2]
            specs[method] = NgramSpeculator(SpeculatorConfig.from_overrides(overrides))
        elif method not in ("greedy", "hf-pld"):
            raise SystemExit(f"unknown method {method!r}: use greedy, hf-pld, ngramspec or ngramspec:name=value,...")
    return specs


def run_method(model, ids, method, max_new_tokens, specs):
    """One generate call; returns (new token ids, seconds, target forwards or None)."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    spec = specs.get(method)
    if method == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = 10
    elif spec is not None:
        kwargs["ngram_speculator"] = spec
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    seconds = time.perf_counter() - start
    forwards = spec.last_stats.target_forwards if spec is not None else None
    return out[0, ids.shape[1] :].tolist(), seconds, forwards


def drafter_scaling(config: SpeculatorConfig, contexts=(1_000, 16_000, 128_000), steps=2_000) -> dict:
    """Median microseconds of one propose() + extend() at several context lengths. The stream
    is random tokens with a repeated tail, so lookups hit and drafts are non-empty."""
    spec = NgramSpeculator(config)
    rng = np.random.default_rng(0)
    result = {}
    for context in contexts:
        stream = rng.integers(0, 49_152, size=context).astype(np.int32)
        session = spec.start(stream, capacity=context + 4 * steps)
        tail = stream[-steps * 4 :]
        times, pos = [], 0
        for _ in range(steps):
            t0 = time.perf_counter()
            draft = session.propose()
            session.extend(tail[pos : pos + 2])
            times.append(time.perf_counter() - t0)
            pos += 2
        result[context] = round(statistics.median(times) * 1e6, 2)
        assert len(draft) > 0
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), a folder or a hub id")
    parser.add_argument("--tasks", default="humanevalfix,quixbugs,editeval_instructcoder,iterater_human,jfleg,asset",
                        help=f"comma-separated sets from: {', '.join(sorted(tasks.FILES))}")
    parser.add_argument("--limit", type=int, default=4, help="items per set (first N in file order)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (stated in the report)")
    parser.add_argument("--data-dir", default=None, help="shared data directory (default: $NGRAMSPEC_DATA or ../shared/data)")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--method", action="append", dest="methods", metavar="METHOD",
                        help="repeatable; plain greedy always runs as the baseline. hf-pld: transformers' "
                             "prompt_lookup_num_tokens=10; ngramspec: default settings; "
                             "ngramspec:name=value,...: other SpeculatorConfig settings ("
                             + ", ".join(f"{f.name}={f.default!r}" for f in SpeculatorConfig.__dataclass_fields__.values())
                             + "). Default: hf-pld and ngramspec")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    methods = ["greedy"] + [m for m in (args.methods or ["hf-pld", "ngramspec"]) if m != "greedy"]
    specs = make_speculators(methods)
    model, tokenizer = ngramspec.load_model(args.model)
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    items = [(name, item) for name in names for item in tasks.load_items(name, args.data_dir, args.limit)]

    # Warm-up (untimed): every method once on the first item.
    warm = torch.tensor([tasks.prompt_ids(tokenizer, items[0][1])])
    for method in methods:
        run_method(model, warm, method, 16, specs)

    rows = []
    for n, (name, item) in enumerate(items):
        ids = torch.tensor([tasks.prompt_ids(tokenizer, item)])
        row = {"set": name, "id": item["id"], "prompt_tokens": ids.shape[1]}
        for method in methods:
            tokens, seconds, forwards = run_method(model, ids, method, args.max_new_tokens, specs)
            row[method] = {"tokens": tokens, "seconds": seconds, "forwards": forwards,
                           "identical": tokens == row["greedy"]["tokens"] if method != "greedy" else True}
        rows.append(row)
        print(f"[{n + 1}/{len(items)}] {name}/{item['id']}: {len(row['greedy']['tokens'])} tokens; "
              + ", ".join(f"{m} {row[m]['seconds']:.2f}s{'' if row[m]['identical'] else ' DIFFERENT'}" for m in methods),
              flush=True)

    def summarize(subset):
        out = {"items": len(subset)}
        greedy_s = sum(r["greedy"]["seconds"] for r in subset)
        for method in methods:
            tokens = sum(len(r[method]["tokens"]) for r in subset)
            seconds = sum(r[method]["seconds"] for r in subset)
            stats = {"tokens_per_s": tokens / seconds, "speedup": greedy_s / seconds,
                     "median_item_speedup": statistics.median(r["greedy"]["seconds"] / r[method]["seconds"] for r in subset),
                     "identical": sum(r[method]["identical"] for r in subset) / len(subset)}
            if method in specs:
                stats["mat"] = tokens / sum(r[method]["forwards"] for r in subset)
            out[method] = stats
        return out

    summary = {name: summarize([r for r in rows if r["set"] == name]) for name in names}
    summary["overall"] = summarize(rows)
    scaling = drafter_scaling(next(iter(specs.values())).config) if specs else {}
    meta = {
        "command": "python -m eval.speedup " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "max_new_tokens": args.max_new_tokens,
        "configs": {m: repr(spec.config) for m, spec in specs.items()},
    }
    lines = [
        f"Model {args.model}, CPU ({meta['cores']} cores), torch {torch.__version__} with {meta['torch_threads']} threads, "
        f"{args.max_new_tokens} new tokens, greedy, batch 1. Speed-up = greedy seconds / method seconds over the same items.",
        "",
        "| set | items | method | tok/s | speedup vs greedy | median item speedup | MAT | identical to greedy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        for method in methods:
            m = s[method]
            mat = f"{m['mat']:.2f}" if "mat" in m else ("1.00" if method == "greedy" else "-")
            lines.append(f"| {name} | {s['items']} | {method} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}x | "
                         f"{m['median_item_speedup']:.2f}x | {mat} | {100 * m['identical']:.0f}% |")
    if scaling:
        lines += ["", "Drafter time per step (propose + extend, median): "
                  + ", ".join(f"{k // 1000}k context {v} us" for k, v in scaling.items())]
    lines += ["", "Settings: " + "; ".join(f"{m} = {c}" for m, c in meta["configs"].items())]
    report = "\n".join(lines)
    print("\n" + report)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text("# ngramspec vs greedy vs transformers prompt lookup\n\n"
                                          f"Command: `{meta['command']}`\n\n" + report + "\n")
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": summary, "drafter_us": scaling, "items": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

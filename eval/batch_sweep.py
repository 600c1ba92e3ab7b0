"""Batch-size sweep: tokens/s of plain batched greedy vs ngramspec at batch sizes 1, 2, 4, 8.

    python -m eval.batch_sweep --model default --batch-sizes 1,2,4,8 --items 16 --threads 2

Takes the same ``--items`` prompts (round-robin over ``--tasks``) for every batch size, groups
them into left-padded batches in order, and for each batch times plain ``generate`` and
``generate(ngram_speculator=...)`` back to back (order alternating per batch, after one
untimed warm-up batch). Tokens/s counts each row's real new tokens (up to and including its
EOS, not the padding after it). "identical" compares each speculative row with the plain
batched row. Prints a Markdown table; ``--json`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import ngramspec
import tasks
from ngramspec import NgramSpeculator, SpeculatorConfig
from ngramspec.hf.target import left_pad
from ngramspec.util.files import write_atomic

DEFAULT_TASKS = "jfleg,asset,iterater_human,humanevalfix,quixbugs,editeval_instructcoder"


def real_new_tokens(row: list[int], eos_ids: set[int]) -> int:
    for i, token in enumerate(row):
        if token in eos_ids:
            return i + 1
    return len(row)


def sweep(model, tokenizer, prompts, batch_sizes, max_new_tokens, speculator) -> list[dict]:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    common = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id)
    ids, mask = left_pad(prompts[: max(batch_sizes)], pad_id)
    model.generate(ids[:2, -64:], attention_mask=mask[:2, -64:], **common | {"max_new_tokens": 8})  # warm-up
    model.generate(ids[:2, -64:], attention_mask=mask[:2, -64:], ngram_speculator=speculator,
                   **common | {"max_new_tokens": 8})
    rows = []
    for batch_size in batch_sizes:
        seconds = {"plain": 0.0, "ngramspec": 0.0}
        tokens = {"plain": 0, "ngramspec": 0}
        identical, forwards, emitted = 0, 0, 0
        groups = [prompts[i : i + batch_size] for i in range(0, len(prompts) - batch_size + 1, batch_size)]
        for g, group in enumerate(groups):
            ids, mask = left_pad(group, pad_id)
            outputs = {}
            for method in (("plain", "ngramspec") if g % 2 == 0 else ("ngramspec", "plain")):
                extra = {"ngram_speculator": speculator} if method == "ngramspec" else {}
                start = time.perf_counter()
                out = model.generate(ids, attention_mask=mask, **common, **extra)
                seconds[method] += time.perf_counter() - start
                outputs[method] = out[:, ids.shape[1] :].tolist()
                tokens[method] += sum(real_new_tokens(r, eos_ids) for r in outputs[method])
            stats = speculator.last_row_stats
            forwards += sum(s.target_forwards for s in stats)
            emitted += sum(s.new_tokens for s in stats)
            identical += sum(a[: real_new_tokens(a, eos_ids)] == b[: real_new_tokens(b, eos_ids)]
                             for a, b in zip(outputs["plain"], outputs["ngramspec"]))
        plain_tps = tokens["plain"] / seconds["plain"]
        spec_tps = tokens["ngramspec"] / seconds["ngramspec"]
        rows.append({
            "batch_size": batch_size, "batches": len(groups), "rows": len(groups) * batch_size,
            "plain_tok_s": round(plain_tps, 2), "ngramspec_tok_s": round(spec_tps, 2),
            "speedup": round(spec_tps / plain_tps, 3), "mat_per_row": round(emitted / forwards, 3),
            "identical_rows": identical, "plain_seconds": round(seconds["plain"], 2),
            "ngramspec_seconds": round(seconds["ngramspec"], 2),
        })
        print(_row_markdown(rows[-1]), flush=True)
    return rows


HEADER = ("| batch | rows | plain tok/s | ngramspec tok/s | speed-up | MAT per row | identical rows |\n"
          "|---|---|---|---|---|---|---|")


def _row_markdown(r: dict) -> str:
    return (f"| {r['batch_size']} | {r['rows']} | {r['plain_tok_s']:.1f} | {r['ngramspec_tok_s']:.1f} | "
            f"{r['speedup']:.2f}x | {r['mat_per_row']:.2f} | {r['identical_rows']}/{r['rows']} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), a folder or a hub id")
    parser.add_argument("--tasks", default=DEFAULT_TASKS,
                        help="comma-separated task names (see python -m eval run --help)")
    parser.add_argument("--data-dir", default=None,
                        help="shared data folder (default: $NGRAMSPEC_DATA or ../shared/data)")
    parser.add_argument("--items", type=int, default=16,
                        help="prompts in total (each batch size decodes all it can group)")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--settings", default="", help="speculator settings, e.g. 'max_draft_tokens=8'")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    try:
        batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
        config = SpeculatorConfig.from_overrides(args.settings)
        names = [t.strip() for t in args.tasks.split(",") if t.strip()]
        unknown = [n for n in names if n not in tasks.TASKS]
        if unknown:
            raise ValueError(f"unknown tasks {unknown}; known: {', '.join(tasks.TASKS)}")
        if min(batch_sizes) < 1 or max(batch_sizes) > args.items:
            raise ValueError(f"batch sizes must be between 1 and --items ({args.items})")
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    torch.set_num_threads(args.threads)
    try:
        model, tokenizer = ngramspec.load_model(args.model)
    except (ValueError, ngramspec.ModelNotFoundError) as err:
        parser.exit(2, f"error: {err}\n")
    per_task = -(-args.items // len(names))
    loaded = {n: tasks.load_items(n, limit=per_task, data_dir=args.data_dir) for n in names}
    prompts = []
    for i in range(per_task):
        for n in names:
            if i < len(loaded[n]) and len(prompts) < args.items:
                prompts.append(tasks.prompt_ids(tokenizer, loaded[n][i]))
    print(f"torch threads: {torch.get_num_threads()}, device: {next(model.parameters()).device}, "
          f"{len(prompts)} prompts from {', '.join(names)}, {args.max_new_tokens} new tokens, {config}\n")
    print(HEADER)
    rows = sweep(model, tokenizer, prompts, batch_sizes, args.max_new_tokens, NgramSpeculator(config))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        command = "python -m eval.batch_sweep " + " ".join(sys.argv[1:] if argv is None else argv)
        write_atomic(args.json, json.dumps({"command": command, "threads": torch.get_num_threads(), "rows": rows},
                                           indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

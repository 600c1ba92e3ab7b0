"""`python -m eval run`: the same items through every method, side by side, resumable, shardable.

Each item runs all methods back to back (interleaved, so machine drift hits every method
alike) after an untimed warm-up. Every finished (item, method) is appended to a JSONL file
at once, so an interrupted run loses at most the generation in flight and a rerun with the
same ``--out`` continues where it stopped. Under ``accelerate launch`` each process takes
every N-th item and writes its own shard file; the main process merges them into the report:

    accelerate launch --multi_gpu --num_processes 2 -m eval run --out runs/NAME ...

(on a machine without CUDA this starts two CPU processes; `--cpu` would make accelerate look
for MPI instead).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

import ngramspec
import tasks
from ngramspec.app.jobs import start_processes
from ngramspec.util.files import RecordLog, read_jsonl, write_atomic

from . import report
from .methods import TRANSFORMERS, ForwardCounter, format_methods, generate, transformers_methods
from .options import add_options, methods_of

RECORDS_GLOB = "items*.jsonl"


def read_records(out_dir: Path) -> list[dict]:
    """Every complete record in the run folder (a torn last line from a crash is skipped)."""
    return read_jsonl(sorted(Path(out_dir).glob(RECORDS_GLOB)))


def _check_meta(out_dir: Path, meta: dict) -> None:
    """A run folder holds one comparable run: same model, token budget and methods."""
    path = out_dir / "meta.json"
    if path.is_file():
        old = json.loads(path.read_text())
        for key in ("model", "max_new_tokens", "methods"):
            if old.get(key) != meta.get(key):
                raise SystemExit(
                    f"{out_dir} holds a run with {key}={old.get(key)!r}, not {meta.get(key)!r}; "
                    "resume with the same settings or choose a new --out."
                )


def run(model_name, task_names, method_text, limit, max_new_tokens, out_dir, data_dir=None, threads=None, quiet=False,
        command=None):
    # Every report states its thread count, so it is always fixed (cores / processes by default).
    processes = start_processes(threads, pin_threads=True)
    rank, world = processes.rank, processes.world

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = transformers_methods(method_text)
    meta = {
        "model": model_name, "tasks": task_names, "methods": [m.name for m in methods], "limit": limit,
        "max_new_tokens": max_new_tokens, "torch_threads": processes.threads, "processes": world,
        "torch": torch.__version__, "device": "cuda" if torch.cuda.is_available() else "cpu",
        "configs": {m.name: repr(m.speculator.config) for m in methods if m.speculator is not None},
        "command": command,
    }
    _check_meta(out_dir, meta)
    processes.wait()
    if processes.is_main:
        write_atomic(out_dir / "meta.json", json.dumps(meta, indent=1))

    model, tokenizer = ngramspec.load_model(model_name, device=processes.device)
    counter = ForwardCounter(model)
    items = [(tasks.TASKS[name], item) for name in task_names for item in tasks.load_items(name, data_dir, limit)]
    mine = items[rank::world]
    done = {(r["task"], r["id"], r["method"]) for r in read_records(out_dir)}
    todo = [(t, i) for t, i in mine if any((t.name, i["id"], m.name) not in done for m in methods)]

    shard = out_dir / ("items.jsonl" if world == 1 else f"items.shard{rank}-of{world}.jsonl")
    if todo:
        warm = torch.tensor([tasks.prompt_ids(tokenizer, todo[0][1])])
        for method in methods:  # untimed warm-up: kernels, caches, allocator
            generate(model, counter, warm, method, 8)
    totals = {m.name: [0, 0.0] for m in methods}  # tokens, seconds (for the live tokens/s)
    bar = tqdm(total=len(todo), desc=f"run[{rank}]" if world > 1 else "run", unit="item", disable=quiet)
    with RecordLog(shard) as sink:
        for task, item in todo:
            ids = torch.tensor([tasks.prompt_ids(tokenizer, item)])
            for method in methods:
                if (task.name, item["id"], method.name) in done:
                    continue
                gen = generate(model, counter, ids, method, max_new_tokens)
                text = tokenizer.decode(gen.tokens, skip_special_tokens=True)
                record = {
                    "task": task.name, "family": task.family, "id": item["id"], "method": method.name,
                    "prompt_tokens": ids.shape[1], "new_tokens": len(gen.tokens), "seconds": gen.seconds,
                    "forwards": gen.forwards, "output_ids": gen.tokens, "scores": task.score(text, item),
                    "stats": gen.stats,
                }
                if method.name == "greedy":
                    record["prompt_ids"] = ids[0].tolist()  # lets the run double as a greedy trace
                sink.append(record)
                totals[method.name][0] += len(gen.tokens)
                totals[method.name][1] += gen.seconds
            bar.update(1)
            bar.set_postfix({m: f"{t / s:.1f} tok/s" for m, (t, s) in totals.items() if s})
    bar.close()
    processes.wait()
    result = report.write(out_dir, read_records(out_dir), meta) if processes.is_main else None
    processes.wait()
    processes.close()
    return result


def export_traces(out_dir: Path, path: Path) -> int:
    """Write the greedy records of a run as traces: {id, dataset, prompt_ids, output_ids}."""
    lines = [json.dumps({"id": f"{r['task']}/{r['id']}", "dataset": r["task"], "prompt_ids": r["prompt_ids"],
                         "output_ids": r["output_ids"]}) + "\n"
             for r in read_records(out_dir) if r["method"] == "greedy"]
    write_atomic(path, "".join(lines))
    return len(lines)


def _common(parser) -> None:
    add_options(parser, "model", "tasks", "limit", "max_new_tokens", "data_dir", "threads", "quiet",
                threads={"help": "torch CPU threads per process (default: cores / processes); stated in the report"})


def add_arguments(parser) -> None:
    _common(parser)
    add_options(parser, "methods", "out",
                methods={"default": "greedy,hf-pld,ngramspec", "type": methods_of(TRANSFORMERS),
                         "help": "comma-separated: greedy (always included: the reference), hf-pld "
                                 "(prompt_lookup_num_tokens=10), ngramspec, ngramspec:name=value,... "
                                 "(SpeculatorConfig settings, e.g. ngramspec:max_n=4,min_n=1)"},
                out={"required": True, "help": "run folder (created; an existing one is resumed)"})


def main(args) -> int:
    run(args.model, args.tasks, format_methods(args.methods), args.limit, args.max_new_tokens, args.out,
        args.data_dir, args.threads, args.quiet, command=args.command_line)
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def add_trace_arguments(parser) -> None:
    parser.description = ("Record plain greedy outputs as JSONL traces {id, dataset, prompt_ids, output_ids}. "
                          "Resumable like run (the run folder is OUT.run/).")
    _common(parser)
    add_options(parser, "out", out={"required": True, "help": "traces JSONL file to write"})


def trace_main(args) -> int:
    run_dir = Path(args.out + ".run")
    run(args.model, args.tasks, "greedy", args.limit, args.max_new_tokens, run_dir, args.data_dir,
        args.threads, args.quiet, command=args.command_line)
    count = export_traces(run_dir, Path(args.out))
    print(f"{count} traces written to {args.out}")
    return 0

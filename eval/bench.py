"""`python -m eval bench`: plain greedy vs transformers' prompt lookup vs ngramspec, one run.

For the same items (methods interleaved per item, rotating order, after an untimed warm-up)
it measures tokens/s of each method, the ngramspec/HF-PLD and ngramspec/greedy ratios, the
per-step overhead outside the model forward (wall time minus time inside ``model.forward``,
per forward, in ms and as a share of the step), identity with greedy, and the drafter's own
cost per step at 1k, 16k and 128k tokens of context.

``--batch-sizes 1,8`` also decodes the items in left-padded batches of 8 (greedy and ngramspec
on the same batches; transformers' prompt lookup decodes batches of one only, so its row is
absent there). ``--dtypes bfloat16,float32`` repeats everything per dtype. ``--measure-cost``
sizes drafts with the cost curve measured on this model and device (``costs.py``) instead of
the default CPU curve: what a GPU run needs.

A batch-size sweep (what ``eval/batch_sweep.py`` did): the same ``--items`` prompts, round-robin
over the sets, at every batch size, greedy against ngramspec:

    python -m eval bench --tasks jfleg,asset,iterater_human,humanevalfix,quixbugs,editeval_instructcoder \
        --items 16 --batch-sizes 1,2,4,8 --max-new-tokens 128 --threads 2 --methods greedy,ngramspec

"MAT per row" counts each row's own forwards (a row that ended early takes no part in the batch's
later forwards); "MAT" counts every forward of its batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

import tasks
from ngramspec.hf.target import left_pad
from ngramspec.util.files import write_atomic

from .drafter_cost import drafter_us_per_step
from .methods import TRANSFORMERS, make_method, parse_method, parse_methods
from .options import add_options, ints, methods_of

METHODS = ("greedy", "hf-pld", "ngramspec")
LEARNED_QS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
UNTIMED_CONTEXT = 400  # where the learned cost table is read when the model timed no forward
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def real_new_tokens(row: list[int], eos_ids: set[int]) -> int:
    """A row's new tokens up to and including its EOS (not the padding after it)."""
    for i, token in enumerate(row):
        if token in eos_ids:
            return i + 1
    return len(row)


class ForwardTimer:
    """Wall time spent inside the model's forward (hooks on the top module). On CUDA the spans
    are CUDA events read after the call (``collect``): syncing around every forward would stall
    the host and change what is measured."""

    def __init__(self, model):
        self.seconds, self.count, self._start = 0.0, 0, 0.0
        self.first = 0.0  # the call's first forward: the prefill, the same work for every method
        self._cuda = next(model.parameters()).is_cuda
        self._events: list = []
        self._hooks = [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def _before(self, *args):
        if self._cuda:
            self._events.append(torch.cuda.Event(enable_timing=True))
            self._events[-1].record()
        else:
            self._start = time.perf_counter()

    def _after(self, *args):
        self.count += 1
        if self._cuda:
            self._events.append(torch.cuda.Event(enable_timing=True))
            self._events[-1].record()
        else:
            self.seconds += time.perf_counter() - self._start
            if self.count == 1:
                self.first = time.perf_counter() - self._start

    def collect(self) -> None:
        """Add the CUDA spans recorded so far (after the work they cover is done)."""
        if self._events:
            torch.cuda.synchronize()
            spans = [start.elapsed_time(end) / 1e3 for start, end in zip(self._events[::2], self._events[1::2])]
            self.seconds += sum(spans)
            self.first = spans[0] if self.count == len(spans) else self.first
            self._events.clear()


def _generate(model, timer, ids, mask, method, max_new_tokens, pad_id):
    """One timed generate() of a batch ``ids`` (B, P): new token lists (each up to and including
    its EOS), wall seconds, seconds inside forward, forwards, seconds of the prefill forward."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id)
    if mask is not None:  # a padded batch (a single row needs none)
        kwargs["attention_mask"] = mask
    kwargs.update(method.generate_kwargs())
    timer.seconds, timer.count, timer.first = 0.0, 0, 0.0
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    rows = out[:, ids.shape[1] :].tolist()  # the host copy ends the timing: all work is done
    wall = time.perf_counter() - start
    timer.collect()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    return [row[: real_new_tokens(row, eos_ids)] for row in rows], wall, timer.seconds, timer.count, timer.first


def select_items(names, limit, data_dir, tokenizer, min_prompt_tokens=0, max_prompt_tokens=None, total=None):
    """The first ``limit`` items of each set whose prompt has ``min_prompt_tokens`` to
    ``max_prompt_tokens`` tokens (a long-prompt set: e.g. 1,000 to 8,000), in file order within
    a set and round-robin over the sets (each set's first, then each set's second...), so a run
    cut short by its time budget still covers every set; the first ``total`` of them. A
    ValueError where the bounds are out of order or no item of any set falls within them."""
    if min_prompt_tokens < 0 or (max_prompt_tokens is not None and max_prompt_tokens < min_prompt_tokens):
        raise ValueError(f"prompt-token bounds must satisfy 0 <= min <= max, got {min_prompt_tokens} and "
                         f"{max_prompt_tokens}")
    per_set = []
    for name in names:
        chosen, found = [], 0
        per_set.append(chosen)
        for item in tasks.load_items(name, limit=None if (min_prompt_tokens or max_prompt_tokens) else limit,
                                     data_dir=data_dir):
            n = len(tasks.prompt_ids(tokenizer, item))
            if n >= min_prompt_tokens and (max_prompt_tokens is None or n <= max_prompt_tokens):
                chosen.append((name, item))
                found += 1
                if limit is not None and found == limit:
                    break
    if not any(per_set):
        bounds = f"at least {min_prompt_tokens}" if max_prompt_tokens is None else \
            f"{min_prompt_tokens} to {max_prompt_tokens}"
        raise ValueError(f"no item of {', '.join(names)} has a prompt of {bounds} tokens")
    return [pair for rank in itertools.zip_longest(*per_set) for pair in rank if pair is not None][:total]


def bench(model, tokenizer, names, limit, max_new_tokens, settings="", data_dir=None, quiet=False,
          batch_size=1, verify_cost=None, method_names=METHODS, prompt_tokens=(0, None), deadline=None,
          on_batch=None, total=None, rounds=1) -> dict:
    """One batch size: every method on the same batches. ``deadline`` (a ``time.time()``) stops
    before a batch that would not end by then, judged by the slowest batch so far (the first
    runs if the deadline has not passed); ``on_batch(result, line)`` is called after every batch with the result
    so far and a one-line summary of that batch, so a run cut off still leaves its table.
    ``rounds``: each batch is decoded that many times by every method, the order rotating each
    round, and each method keeps its best round (a single pair of runs moves +-10% here)."""
    from tqdm import tqdm

    methods = [make_method(parse_method(f"ngramspec:{settings}", TRANSFORMERS) if m.name == "ngramspec" and settings
                           else m)
               for m in parse_methods(method_names, TRANSFORMERS)]
    if verify_cost is not None:  # the measured curve of this model and device
        from ngramspec import NgramSpeculator

        config = dataclasses.replace(methods[-1].speculator.config, verify_cost=verify_cost)
        methods[-1].speculator = NgramSpeculator(config)
    if batch_size > 1:  # transformers' assisted decoding (prompt lookup) takes batches of one only
        methods = [m for m in methods if m.name != "hf-pld"]
    timer = ForwardTimer(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    items = select_items(names, limit, data_dir, tokenizer, *prompt_tokens, total=total)
    prompts = [tasks.prompt_ids(tokenizer, item) for _, item in items]
    groups = [list(range(i, min(i + batch_size, len(items)))) for i in range(0, len(items), batch_size)]
    # Warm-up on the shortest prompts: it compiles and allocates; its length does not matter.
    shortest = sorted(prompts, key=len)[:batch_size]
    warm, warm_mask = left_pad(shortest, pad_id)
    warm_mask = warm_mask.to(model.device) if batch_size > 1 else None
    for method in methods:
        _generate(model, timer, warm.to(model.device), warm_mask, method, 8, pad_id)
    if on_batch is not None:
        on_batch(None, f"b={batch_size} warmed up: {len(groups)} batches planned")
    totals = defaultdict(lambda: defaultdict(float))
    identical = defaultdict(int)
    per_item = defaultdict(list)  # (group, method) -> (end-to-end, decode phase) ratios vs greedy
    item_rows = []  # batch size 1: each item's prompt, greedy time, and every method's ratio and MAT
    batch_seconds = defaultdict(list)  # method -> wall seconds of each batch, in batch order
    done, slowest = 0, 0.0
    for g, group in enumerate(tqdm(groups, desc=f"bench b={batch_size}", unit="batch", disable=quiet)):
        # The first batch runs while the part's time lasts; later ones only if the slowest so
        # far would still end in time (the caller bounds the whole run from outside as well).
        if deadline is not None and time.time() + slowest > deadline:
            break
        batch_start = time.perf_counter()
        ids, mask = left_pad([prompts[i] for i in group], pad_id)
        ids, mask = ids.to(model.device), (mask.to(model.device) if batch_size > 1 else None)
        outputs, seconds, best = {}, {}, {}
        for r in range(rounds):
            turn = g + r
            for method in methods[turn % len(methods) :] + methods[: turn % len(methods)]:
                rows, wall, inside, forwards, prefill = _generate(model, timer, ids, mask, method, max_new_tokens,
                                                                  pad_id)
                if method.name in outputs and rows != outputs[method.name]:
                    raise RuntimeError(f"{method.name} decoded batch {g} differently in round {r + 1}")
                outputs[method.name] = rows
                if on_batch is not None:  # something on screen before the batch's last method ends
                    on_batch(None, f"b={batch_size} batch {g + 1}/{len(groups)} round {r + 1}: {method.name} "
                                   f"{wall:.2f} s")
                if method.name not in best or wall < best[method.name][0]:
                    stats = method.speculator.last_row_stats if method.speculator is not None else None
                    best[method.name] = (wall, inside, forwards, prefill, stats)
        for method in methods:
            rows = outputs[method.name]
            wall, inside, forwards, prefill, stats = best[method.name]
            seconds[method.name] = (wall, wall - prefill)
            batch_seconds[method.name].append(wall)
            own = ([s.target_forwards for s in stats] if stats is not None
                   else [len(row) for row in rows] if method.name == "greedy" else [forwards] * len(rows))
            # A batch's wall time is shared by its rows; each row's family gets its share.
            for i, row, row_own in zip(group, rows, own):
                for key in (tasks.family_of(items[i][0]), "overall"):
                    t = totals[(key, method.name)]
                    t["items"] += 1
                    t["tokens"] += len(row)
                    t["seconds"] += wall / len(group)
                    t["decode_seconds"] += (wall - prefill) / len(group)
                    t["forward_seconds"] += inside / len(group)
                    t["forwards"] += forwards / len(group)
                    t["row_forwards"] += forwards  # forwards this row took part in
                    t["own_forwards"] += row_own  # forwards this row needed
        same = True
        for method in methods[1:]:
            for i, mine, greedy in zip(group, outputs[method.name], outputs["greedy"]):
                same &= mine == greedy
                for key in (tasks.family_of(items[i][0]), "overall"):
                    identical[(key, method.name)] += mine == greedy
                    # Same tokens, so a ratio of times is the ratio of tokens/s.
                    per_item[(key, method.name)].append(
                        tuple(g / m for g, m in zip(seconds["greedy"], seconds[method.name])))
        if batch_size == 1:
            name, item = items[group[0]]
            item_rows.append({"set": name, "id": item.get("id"), "prompt_tokens": len(prompts[group[0]]),
                              "greedy_s": round(seconds["greedy"][0], 3), "methods": {
                                  m.name: {"x_greedy": round(seconds["greedy"][0] / seconds[m.name][0], 3),
                                           "mat": round(best[m.name][4][0].mat, 2) if best[m.name][4] else None}
                                  for m in methods[1:]}})
        done += 1
        slowest = max(time.perf_counter() - batch_start, slowest)
        if on_batch is not None:
            ratios = ", ".join(f"{m.name} {seconds['greedy'][0] / seconds[m.name][0]:.2f}x" for m in methods[1:])
            sets = ",".join(sorted({items[i][0] for i in group}))
            line = (f"b={batch_size} batch {done}/{len(groups)} ({sets}): greedy {seconds['greedy'][0]:.2f} s, "
                    f"{ratios}, {'identical' if same else 'OUTPUTS DIFFER'}")
            on_batch(_summary(totals, identical, per_item, batch_seconds, batch_size, methods, done, len(groups),
                              item_rows), line)
    timer.remove()
    return _summary(totals, identical, per_item, batch_seconds, batch_size, methods, done, len(groups), item_rows)


def _summary(totals, identical, per_item, batch_seconds, batch_size, methods, done, planned, item_rows=()) -> dict:
    rows = []
    for (group, name), t in totals.items():
        rows.append({
            "group": group, "method": name, "items": int(t["items"]), "batch_size": batch_size,
            "tok_s": t["tokens"] / t["seconds"], "mat": t["tokens"] / t["row_forwards"],
            "mat_per_row": t["tokens"] / t["own_forwards"],
            "decode_tok_s": t["tokens"] / t["decode_seconds"],
            "min_item_x_greedy": min((r[0] for r in per_item.get((group, name), [])), default=1.0),
            "min_item_x_greedy_decode": min((r[1] for r in per_item.get((group, name), [])), default=1.0),
            "overhead_ms_per_step": 1e3 * (t["seconds"] - t["forward_seconds"]) / t["forwards"],
            "overhead_share": (t["seconds"] - t["forward_seconds"]) / t["seconds"],
            "identical": identical.get((group, name), int(t["items"])) / t["items"],
        })
    by = {(r["group"], r["method"]): r for r in rows}
    for r in rows:
        r["x_greedy"] = r["tok_s"] / by[(r["group"], "greedy")]["tok_s"]
        r["x_greedy_decode"] = r["decode_tok_s"] / by[(r["group"], "greedy")]["decode_tok_s"]
        pld = by.get((r["group"], "hf-pld"))
        r["x_hf_pld"] = r["tok_s"] / pld["tok_s"] if pld else None
    spec = methods[-1].speculator
    return {"rows": rows, "settings": repr(spec.config), "paired": paired(batch_seconds, batch_size),
            "items": list(item_rows),
            "batches": [{"batch_size": batch_size, "done": done, "planned": planned}],
            "learned_costs": learned_costs(methods)}


def learned_costs(methods) -> dict:
    """What each online cost model (a method with no fixed ``verify_cost``) has learned so far:
    its forward cost over q tokens relative to one, at the context where most of its forwards
    were timed (elsewhere it reads the prior: the items' contexts set where it learns; 400
    tokens (UNTIMED_CONTEXT) where none was timed)."""
    out = {}
    for m in methods:
        if m.speculator is not None and m.speculator.cost_model.learn:
            model = m.speculator.cost_model
            context = model.timed_context() or UNTIMED_CONTEXT
            out[m.name] = {"observations": model.observations, "context": context,
                           "curve": [(q, round(float(model(q, context)), 3)) for q in LEARNED_QS]}
    return out


def paired(batch_seconds: dict, batch_size: int) -> list[dict]:
    """Per batch (an item at batch size 1), the first speculative method against each later one
    (e.g. the online cost model against a fixed curve): its speed-up over the other on the same
    items, the same outputs. Noise included: one batch's ratio moves by 10-20% run to run."""
    names = [n for n in batch_seconds if n != "greedy"]
    out = []
    for other in names[1:]:
        ratios = sorted(o / r for r, o in zip(batch_seconds[names[0]], batch_seconds[other]))
        out.append({"batch_size": batch_size, "method": names[0], "other": other, "batches": len(ratios),
                    "worst": ratios[0], "median": ratios[len(ratios) // 2],
                    "at_least_level": sum(r >= 1.0 for r in ratios), "at_least_095": sum(r >= 0.95 for r in ratios)})
    return out


def markdown(result: dict) -> str:
    lines = ["| dtype | batch | group | method | items | tok/s | x greedy | x hf-pld | decode-phase x greedy | "
             "worst item x greedy (decode phase) | MAT | overhead ms/step | overhead share | identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {"summarization": 0, "rewriting": 1, "code_editing": 2, "overall": 3}
    for r in sorted(result["rows"], key=lambda r: (r.get("dtype", ""), r["batch_size"], order.get(r["group"], 9),
                                                   METHODS.index(r["method"]) if r["method"] in METHODS else 9)):
        pld = f"{r['x_hf_pld']:.2f}x" if r["x_hf_pld"] is not None else "n/a"
        lines.append(f"| {r.get('dtype', '')} | {r['batch_size']} | {r['group']} | {r['method']} | {r['items']} | "
                     f"{r['tok_s']:.2f} | {r['x_greedy']:.2f}x | {pld} | {r['x_greedy_decode']:.2f}x | "
                     f"{r['min_item_x_greedy']:.2f}x ({r['min_item_x_greedy_decode']:.2f}x) | {r['mat']:.2f} | "
                     f"{r['overhead_ms_per_step']:.2f} | {100 * r['overhead_share']:.1f}% | "
                     f"{100 * r['identical']:.0f}% |")
    if result.get("paired"):
        lines += ["", "Per batch (an item at batch 1), same outputs: the first speculative method's speed-up over "
                  "each later one.", "",
                  "| dtype | batch | method | against | batches | worst | median | at least 1.00x | at least 0.95x |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p in result["paired"]:
            lines.append(f"| {p.get('dtype', '')} | {p['batch_size']} | {p['method']} | {p['other']} | "
                         f"{p['batches']} | {p['worst']:.2f}x | {p['median']:.2f}x | {p['at_least_level']} | "
                         f"{p['at_least_095']} |")
    items = result.get("items") or []
    if items:
        names = list(items[0]["methods"])
        lines += ["", "Per item (batch 1, each method's best round): speed-up over greedy on the same output, "
                  "and MAT.", "",
                  "| dtype | set | id | prompt tokens | greedy s | " + " | ".join(names) + " |",
                  "|---|---|---|---|---|" + "---|" * len(names)]
        for it in items:
            cells = [f"{it['methods'][n]['x_greedy']:.2f}x" + (f" ({it['methods'][n]['mat']:.2f})"
                                                               if it["methods"][n]["mat"] is not None else "")
                     for n in names]
            lines.append(f"| {it.get('dtype', '')} | {it['set']} | {it['id']} | {it['prompt_tokens']} | "
                         f"{it['greedy_s']:.2f} | " + " | ".join(cells) + " |")
    d = result.get("drafter_us_per_step")
    if d:
        lines += ["", "Drafter (propose + extend) per step: "
                  + ", ".join(f"{int(c) // 1000}k context {us:.1f} us" for c, us in d.items())]
    if result.get("verify_costs"):
        for dtype, curve in result["verify_costs"].items():
            lines.append(f"Measured verify cost ({dtype}): " + ", ".join(f"q={q}: {c:.2f}" for q, c in curve))
    for dtype, learned in result.get("learned_costs", {}).items():
        measured = dict(result.get("measured_costs", {}).get(dtype, ()))
        for name, model in learned.items():
            context = model.get("context", UNTIMED_CONTEXT)
            lines += ["", f"Verify cost at {context} tokens of context relative to one token "
                      f"({dtype}): what {name}'s online cost model learned ({model['observations']} timed forwards, "
                      "most of them at this context)"
                      + (" beside this device's measured curve" if measured else ""), "",
                      "| q | " + " | ".join(str(q) for q, _ in model["curve"]) + " |",
                      "|---|" + "---|" * len(model["curve"]),
                      "| learned | " + " | ".join(f"{c:.2f}" for _, c in model["curve"]) + " |"]
            if measured:
                lines.append("| measured | " + " | ".join(f"{measured[q]:.2f}" if q in measured else "" for q, _ in
                                                          model["curve"]) + " |")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    add_options(parser, "model", "tasks", "limit", "max_new_tokens", "data_dir", "threads", "quiet", "settings")
    parser.add_argument("--items", type=int, default=None,
                        help="only the first N items in all, round-robin over the sets (a batch-size sweep: the "
                             "same N prompts at every batch size)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: CUDA when available)")
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated: float32, bfloat16, float16 (default: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--batch-sizes", type=ints, default="1",
                        help="comma-separated; above 1, items are decoded in left-padded batches (greedy and "
                             "ngramspec only: transformers' prompt lookup takes batches of one)")
    parser.add_argument("--measure-cost", action="store_true",
                        help="size drafts with the verify-cost curve measured on this model and device (cached; "
                             "a fixed curve) instead of the online cost model")
    parser.add_argument("--print-cost", action="store_true",
                        help="also measure this device's verify-cost curve and print it beside the one the online "
                             "cost model learned during the run (sizing is unchanged)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="time budget in seconds for the whole command: no batch is started that would not "
                             "end in it (judged by the slowest batch so far); bench.md and bench.json are "
                             "rewritten after every batch, so a cut run leaves its table")
    add_options(parser, "methods", "out",
                methods={"default": ",".join(METHODS), "type": methods_of(TRANSFORMERS),
                         "help": "comma-separated: greedy first (the baseline), then any of hf-pld, ngramspec, "
                                 "ngramspec:name=value,... (settings variants side by side)"},
                out={"help": "folder for bench.md and bench.json"})
    parser.add_argument("--min-prompt-tokens", type=int, default=0,
                        help="only items whose prompt has at least this many tokens (a long-prompt set)")
    parser.add_argument("--max-prompt-tokens", type=int, default=None,
                        help="only items whose prompt has at most this many tokens")
    parser.add_argument("--rounds", type=int, default=1,
                        help="decode each batch this many times per method, the order rotating, and keep each "
                             "method's best (2 or more for per-item ratios: one pair of runs moves +-10%%)")


def main(args) -> int:
    from ngramspec import load_model
    from ngramspec.app.jobs import threads_for_busy_cores
    from ngramspec.cost.curves import cached_cost_curve, measure_cost_curve
    from ngramspec.draft.config import parse_config

    if args.methods[0].kind != "greedy" or len(args.methods) < 2:
        raise ValueError(f"--methods must start with greedy and name others among {', '.join(TRANSFORMERS)}")
    started = time.time()
    deadline = started + args.budget_s if args.budget_s else None
    # No --threads on a CPU whose cores other processes keep busy: the cores they leave free, as
    # the document tool does (OpenMP's default threads collapse there, eval/results/threads).
    on_cpu = args.device in (None, "cpu")
    threads = args.threads or (threads_for_busy_cores(torch.get_num_threads()) if on_cpu else None)
    if threads and not args.threads:
        print(f"torch threads {threads}: other processes keep the other cores busy", flush=True)
    torch.set_num_threads(threads or torch.get_num_threads())
    names = args.tasks
    batch_sizes = sorted(set(args.batch_sizes))
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else [None]
    unknown = [d for d in dtypes if d is not None and d not in DTYPES]
    if unknown:
        raise ValueError(f"dtypes must be among {', '.join(DTYPES)}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if args.items is not None and max(batch_sizes) > args.items:
        raise ValueError(f"batch sizes must be at most --items ({args.items})")
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError as err:
            raise ValueError(f"--device {args.device!r}: {err}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: this machine has no CUDA device")
    result = {"rows": [], "paired": [], "batches": [], "items": [], "verify_costs": {}, "measured_costs": {},
              "learned_costs": {}, "command": args.command_line, "threads": torch.get_num_threads(),
              "torch": torch.__version__}
    config = parse_config(args.settings or "")

    def report(part=None, line=None):
        """Print ``line`` and rewrite bench.md/bench.json with everything so far plus ``part``."""
        now = dict(result)
        if part is None and line is not None:  # a line only (a phase began)
            print(f"[{(time.time() - started) / 60:.1f} min] {dtype_name} {line}", flush=True)
            return now
        if part is not None:
            for key in ("rows", "paired", "batches", "items"):
                now[key] = result[key] + [r | {"dtype": dtype_name} for r in part[key]]
            now["settings"] = part["settings"]
            now["learned_costs"] = result["learned_costs"] | {dtype_name: part["learned_costs"]}
        now["minutes"] = round((time.time() - started) / 60, 1)
        if line is not None:
            print(f"[{now['minutes']:.1f} min] {dtype_name} {line}", flush=True)
        if args.out:
            text = header(now, args.max_new_tokens) + markdown(now)
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            write_atomic(out / "bench.md", f"# Benchmark\n\nCommand: `{args.command_line}`\n\n{text}\n")
            write_atomic(out / "bench.json", json.dumps(now, indent=1, default=str))
        return now

    for dtype in dtypes:
        if deadline is not None and time.time() > deadline:
            print(f"time budget spent: {dtype} not run", flush=True)
            break
        model, tokenizer = load_model(args.model, device=args.device, dtype=DTYPES.get(dtype))
        dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
        result["device"] = str(model.device)
        if result["device"].startswith("cuda"):
            result["gpu"] = torch.cuda.get_device_name(0)
        curve = cached_cost_curve(model) if args.measure_cost else None
        if curve:
            result["verify_costs"][dtype_name] = curve
        for b, batch_size in enumerate(batch_sizes):
            # Each (dtype, batch size) part gets an equal share of what is left, so a tight budget
            # still measures every part, on fewer items.
            parts_left = (len(dtypes) - dtypes.index(dtype)) * len(batch_sizes) - b
            part_deadline = None if deadline is None else time.time() + (deadline - time.time()) / parts_left
            part = bench(model, tokenizer, names, args.limit, args.max_new_tokens, args.settings, args.data_dir,
                         args.quiet, batch_size, curve, method_names=args.methods,
                         prompt_tokens=(args.min_prompt_tokens, args.max_prompt_tokens), deadline=part_deadline,
                         total=args.items, rounds=args.rounds,
                         on_batch=lambda part, line: report(part, line))
            result = report(part)
        # Measured after the benchmark, for the table only (sizing stays with the online model),
        # so the items come first within a budget: this takes ~10 forwards per q.
        if args.print_cost and (deadline is None or time.time() < deadline):
            learned = result["learned_costs"].get(dtype_name, {})
            # where the learned curve is read
            context = next(iter(learned.values()), {}).get("context", UNTIMED_CONTEXT)
            measured = measure_cost_curve(model, context=context, qs=LEARNED_QS, repeats=5)
            result["measured_costs"][dtype_name] = [(q, round(measured[q], 3)) for q in LEARNED_QS]
            result = report(line="measured verify cost " + ", ".join(f"q={q}: {c:.2f}" for q, c in
                                                                      result["measured_costs"][dtype_name]))
        elif args.print_cost:
            report(line="verify cost not measured: time budget spent")
        del model
    if deadline is None or time.time() < deadline:
        result["drafter_us_per_step"] = {c: drafter_us_per_step(config, c) for c in (1_000, 16_000, 128_000)}
    result = report()
    print(header(result, args.max_new_tokens) + markdown(result))
    return 0


def header(result: dict, max_new_tokens: int) -> str:
    cut = [b for b in result["batches"] if b["done"] < b["planned"]]
    budget = ("" if not cut else "\n\nCut by the time budget: " + ", ".join(
        f"{b.get('dtype', '')} batch size {b['batch_size']}: {b['done']} of {b['planned']} batches" for b in cut))
    device = result.get('gpu', result.get('device'))
    return (f"torch {result['torch']}, torch threads {result['threads']}, device {device}, "
            f"{max_new_tokens} new tokens, {result.get('minutes', 0)} min, ngramspec settings: "
            f"{result.get('settings', '')}{budget}\n\n")

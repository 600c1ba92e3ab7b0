"""`python -m eval bench`: plain greedy vs transformers' prompt lookup vs ngramspec, one run.

For the same items (methods interleaved per item, rotating order, after an untimed warm-up)
it measures tokens/s of each method, the ngramspec/HF-PLD and ngramspec/greedy ratios, the
per-step overhead outside the model forward (wall time minus time inside ``model.forward``,
per forward, in ms and as a share of the step), identity with greedy, and the drafter's own
cost per step at 1k, 16k and 128k tokens of context.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import torch

import tasks

from .drafter_cost import drafter_us_per_step
from .methods import HF_PLD_TOKENS, parse_method

METHODS = ("greedy", "hf-pld", "ngramspec")


class ForwardTimer:
    """Wall time spent inside the model's forward (hooks on the top module)."""

    def __init__(self, model):
        self.seconds, self.count, self._start = 0.0, 0, 0.0
        self._sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def _before(self, *args):
        self._sync()
        self._start = time.perf_counter()

    def _after(self, *args):
        self._sync()
        self.seconds += time.perf_counter() - self._start
        self.count += 1


def _generate(model, timer, ids, method, max_new_tokens):
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if method.name == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
    elif method.speculator is not None:
        kwargs["ngram_speculator"] = method.speculator
    timer.seconds, timer.count = 0.0, 0
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    wall = time.perf_counter() - start
    return out[0, ids.shape[1] :].tolist(), wall, timer.seconds, timer.count


def bench(model, tokenizer, names, limit, max_new_tokens, settings="", data_dir=None, quiet=False) -> dict:
    from tqdm import tqdm

    methods = [parse_method(m if m != "ngramspec" or not settings else f"ngramspec:{settings}") for m in METHODS]
    timer = ForwardTimer(model)
    items = [(n, item) for n in names for item in tasks.load_items(n, limit=limit, data_dir=data_dir)]
    warm = torch.tensor([tasks.prompt_ids(tokenizer, items[0][1])])
    for method in methods:
        _generate(model, timer, warm, method, 8)
    totals = defaultdict(lambda: defaultdict(float))
    identical = defaultdict(int)
    for i, (name, item) in enumerate(tqdm(items, desc="bench", unit="item", disable=quiet)):
        ids = torch.tensor([tasks.prompt_ids(tokenizer, item)], device=model.device)
        order = methods[i % 3 :] + methods[: i % 3]
        outputs = {}
        for method in order:
            tokens, wall, inside, forwards = _generate(model, timer, ids, method, max_new_tokens)
            outputs[method.name] = tokens
            for group in (tasks.family_of(name), "overall"):
                t = totals[(group, method.name)]
                t["items"] += 1
                t["tokens"] += len(tokens)
                t["seconds"] += wall
                t["forward_seconds"] += inside
                t["forwards"] += forwards
        for method in methods[1:]:
            same = outputs[method.name] == outputs["greedy"]
            for group in (tasks.family_of(name), "overall"):
                identical[(group, method.name)] += same
    rows = []
    for (group, name), t in totals.items():
        rows.append({
            "group": group, "method": name, "items": int(t["items"]),
            "tok_s": t["tokens"] / t["seconds"], "mat": t["tokens"] / t["forwards"],
            "overhead_ms_per_step": 1e3 * (t["seconds"] - t["forward_seconds"]) / t["forwards"],
            "overhead_share": (t["seconds"] - t["forward_seconds"]) / t["seconds"],
            "identical": identical.get((group, name), int(t["items"])) / t["items"],
        })
    by = {(r["group"], r["method"]): r for r in rows}
    for r in rows:
        r["x_greedy"] = r["tok_s"] / by[(r["group"], "greedy")]["tok_s"]
        r["x_hf_pld"] = r["tok_s"] / by[(r["group"], "hf-pld")]["tok_s"]
    config = methods[2].speculator.config
    drafter = {c: drafter_us_per_step(config, c) for c in (1_000, 16_000, 128_000)}
    return {"rows": rows, "drafter_us_per_step": drafter, "settings": repr(config)}


def markdown(result: dict) -> str:
    lines = ["| group | method | items | tok/s | x greedy | x hf-pld | MAT | overhead ms/step | overhead share | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    order = {"summarization": 0, "rewriting": 1, "code_editing": 2, "overall": 3}
    for r in sorted(result["rows"], key=lambda r: (order.get(r["group"], 9), METHODS.index(r["method"]))):
        lines.append(f"| {r['group']} | {r['method']} | {r['items']} | {r['tok_s']:.2f} | {r['x_greedy']:.2f}x | "
                     f"{r['x_hf_pld']:.2f}x | {r['mat']:.2f} | {r['overhead_ms_per_step']:.2f} | "
                     f"{100 * r['overhead_share']:.1f}% | {100 * r['identical']:.0f}% |")
    d = result["drafter_us_per_step"]
    lines += ["", "Drafter (propose + extend) per step: " + ", ".join(f"{c // 1000}k context {us:.1f} us" for c, us in d.items())]
    return "\n".join(lines)


def main(args) -> int:
    from ngramspec import load_model

    torch.set_num_threads(args.threads or torch.get_num_threads())
    model, tokenizer = load_model(args.model)
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    started = time.time()
    result = bench(model, tokenizer, names, args.limit, args.max_new_tokens, args.settings, args.data_dir, args.quiet)
    result.update(command=args.command_line, threads=torch.get_num_threads(), device=str(model.device),
                  torch=torch.__version__, minutes=round((time.time() - started) / 60, 1))
    text = (f"torch threads {result['threads']}, device {result['device']}, {args.max_new_tokens} new tokens, "
            f"ngramspec settings: {result['settings']}\n\n" + markdown(result))
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.md").write_text(f"# Benchmark\n\nCommand: `{args.command_line}`\n\n{text}\n")
        (out / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    return 0

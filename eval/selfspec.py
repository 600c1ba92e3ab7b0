"""`python -m eval selfspec`: would the target's own shallow layers make a useful drafter?

Agreement. For a few items of every set, plain greedy decoding runs one token per forward with
``output_hidden_states``. At each generated position the *shallow prediction* of depth k is
``argmax(lm_head(norm(h_k)))`` of the position before (h_k: the residual stream after layer k),
compared with the full model's greedy token. Because the first k layers never look at later
layers, this is exactly what a depth-k drafter proposes given the accepted prefix, so each
depth's agreement sequence also replays drafting exactly (``tokens/cycle`` below). Layer-skip sets
(SWIFT-style: keep the first and last layers, skip some middle ones) change the hidden state of
every kept layer after the gap, so they get a real forward: before each full step, the current
token runs through the kept layers only, on the shared cache (the full model's keys and values
of the context), and its entries are cropped again.

Copy breaks. The n-gram rule here is stated, not ngramspec's drafter: the longest suffix of the
text so far (1..8 tokens) that occurred earlier in it predicts the token that followed its most
recent earlier occurrence. A position is a *copy break* when that rule has no match or predicts
wrongly; those are the positions a shallow drafter would have to serve next to ngramspec.

Cost. On a context of ``--short`` and ``--long`` tokens, one decode step through each layer set
(1 token, the head included) and full forwards over q = 2..8 tokens (the verify), each timed
relative to one full one-token step; best of ``--rounds`` alternating rounds, torch threads as
``--threads``.

Expected speed-up of drafting g tokens shallowly, then verifying g + 1 with the full model:
``((1 - a^(g+1)) / (1 - a)) / (g * c + V(g + 1))``, a: agreement, c: shallow step cost, V(q):
verify cost of q tokens, all relative to one full step (plain greedy: 1 token per 1).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "eval" / "results" / "selfspec.md"
MAX_SUFFIX = 8
MAX_VERIFY = 8


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or a path")
    parser.add_argument("--sets", default="all", help="comma-separated set names (tasks.TASKS) or 'all'")
    parser.add_argument("--items", type=int, default=3, help="items per set (first in file order)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=1536, help="longer prompts are skipped")
    parser.add_argument("--depths", default="4,8,12,16,20,24,28", help="prefix depths k")
    parser.add_argument("--skips", default="4+4,8+8,6+6/2,10+10/2",
                        help="layer-skip sets FIRST+LAST[/EVERY]: keep the first FIRST and last LAST layers "
                             "and every EVERY-th middle one (none without /EVERY)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    parser.add_argument("--short", type=int, default=128, help="short context for the cost, tokens")
    parser.add_argument("--long", type=int, default=1024, help="long context for the cost, tokens")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timing rounds (best of)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="markdown report")
    parser.add_argument("--records", default=None,
                        help="JSONL of per-item results, appended after each item; items already in it are not "
                             "measured again (a run interrupted or split over several commands resumes)")
    parser.add_argument("--json", default=None, help="also write the raw numbers here")


def layer_sets(args, num_layers: int) -> dict[str, tuple[int, ...]]:
    """name -> kept layer indices: prefix depths first, then the skip sets."""
    from ngramspec.hf.shallow import prefix_layers, skip_middle

    sets = {f"first {k}": prefix_layers(k) for k in map(int, args.depths.split(",")) if 0 < k < num_layers}
    for spec in filter(None, args.skips.split(",")):
        ends, _, every = spec.partition("/")
        first, last = map(int, ends.split("+"))
        kept = skip_middle(num_layers, first, last, int(every or 0))
        sets[f"skip {num_layers - len(kept)} mid ({spec})"] = kept
    return sets


def copy_predictions(text: list[int], start: int) -> np.ndarray:
    """For g in start..len(text)-1: the token the longest earlier-seen suffix of text[:g]
    (1..MAX_SUFFIX tokens) was followed by at its most recent earlier occurrence; -1: no match."""
    arr = np.asarray(text, dtype=np.int64)
    out = np.full(len(text) - start, -1, dtype=np.int64)
    for g in range(start, len(text)):
        for n in range(min(MAX_SUFFIX, g - 1), 0, -1):
            # windows arr[j:j+n] for j + n <= g - 1, so a following token arr[j+n] exists before g
            windows = np.lib.stride_tricks.sliding_window_view(arr[: g - 1], n)
            hits = np.flatnonzero((windows == arr[g - n: g]).all(axis=1))
            if hits.size:
                out[g - start] = arr[hits[-1] + n]
                break
    return out


def measure_item(model, prompt: list[int], sets: dict, max_new: int, eos: set[int]) -> dict:
    """Greedy tokens and, per layer set, its predictions at every generated position."""
    import torch
    from transformers import DynamicCache

    from ngramspec.hf.shallow import crop_layers, running_layers

    norm, head = model.get_decoder().norm, model.lm_head
    cache = DynamicCache(config=model.config)
    model(torch.tensor([prompt[:-1]]), cache=cache, logits_to_keep=1)
    current, tokens = prompt[-1], []
    preds: dict[str, list[int]] = {name: [] for name in sets}
    prefix = {name: len(kept) for name, kept in sets.items() if kept == tuple(range(len(kept)))}
    while len(tokens) < max_new:
        step = torch.tensor([[current]])
        length = cache.get_seq_length()
        for name, kept in sets.items():
            if name in prefix:
                continue
            with running_layers(model, kept):
                logits = model(step, cache=cache, logits_to_keep=1).logits  # (1, 1, V)
            crop_layers(cache, kept, cache.get_seq_length() - length)
            preds[name].append(int(logits[0, -1].argmax()))
        out = model(step, cache=cache, logits_to_keep=1, output_hidden_states=True)
        for name, depth in prefix.items():
            h = out.hidden_states[depth][0, -1]  # (hidden,): residual stream after layer `depth`
            preds[name].append(int(head(norm(h)).argmax()))
        current = int(out.logits[0, -1].argmax())
        tokens.append(current)
        if current in eos:
            break
    return {"tokens": tokens, "preds": preds}


def replay_tokens_per_cycle(agree: np.ndarray, gamma: int) -> float:
    """Tokens emitted per verify when drafting ``gamma`` tokens at every step, replayed exactly
    over one item's agreement sequence (a draft's i-th token is right iff the prediction at that
    position agrees; a step emits the accepted ones and the target's next token)."""
    p, emitted, cycles = 0, 0, 0
    while p < len(agree):
        accepted = 0
        while accepted < gamma and p + accepted < len(agree) - 1 and agree[p + accepted]:
            accepted += 1
        emitted += accepted + 1
        p += accepted + 1
        cycles += 1
    return emitted / max(cycles, 1)


def expected_tokens(a: float, gamma: int) -> float:
    return float(gamma + 1) if a >= 1 else (1 - a ** (gamma + 1)) / (1 - a)


def time_costs(model, context: list[int], sets: dict, rounds: int) -> dict[str, float]:
    """Best-of-rounds seconds of one step per layer set and of full forwards over q tokens."""
    import torch
    from transformers import DynamicCache

    from ngramspec.hf.shallow import crop_layers, running_layers

    cache = DynamicCache(config=model.config)
    model(torch.tensor([context]), cache=cache, logits_to_keep=1)
    length = cache.get_seq_length()
    tail = context[-MAX_VERIFY:]

    def timed(kept, q):
        ids = torch.tensor([tail[:q]])
        start = time.perf_counter()
        if kept is None:
            model(ids, cache=cache, logits_to_keep=q)
        else:
            with running_layers(model, kept):
                model(ids, cache=cache, logits_to_keep=1)
        elapsed = time.perf_counter() - start
        crop_layers(cache, range(len(cache.layers)) if kept is None else kept, cache.get_seq_length() - length)
        return elapsed

    jobs = {"full": (None, 1), **{f"verify {q}": (None, q) for q in range(2, MAX_VERIFY + 1)},
            **{name: (kept, 1) for name, kept in sets.items()}}
    best = {name: float("inf") for name in jobs}
    for job in jobs.values():  # warm-up
        timed(*job)
    for r in range(rounds):
        order = list(jobs.items()) if r % 2 == 0 else list(reversed(jobs.items()))
        for name, job in order:
            best[name] = min(best[name], timed(*job))
    return best


def main(args) -> int:
    import torch

    import tasks
    from ngramspec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model, tokenizer = load_model(args.model)
    model.eval()
    num_layers = model.config.num_hidden_layers
    sets = layer_sets(args, num_layers)
    names = list(tasks.TASKS) if args.sets == "all" else args.sets.split(",")
    eos = {int(t) for t in np.atleast_1d(model.generation_config.eos_token_id or [])}
    records, started = [], time.perf_counter()
    done = {}
    if args.records and Path(args.records).exists():
        done = {(r["set"], r["id"]): r for r in map(json.loads, Path(args.records).read_text().splitlines())}
    for set_name in names:
        for item in tasks.load_items(set_name, args.data_dir, args.items):
            if (set_name, item["id"]) in done:
                records.append(done[(set_name, item["id"])])
                continue
            prompt = tasks.prompt_ids(tokenizer, item)
            if len(prompt) > args.max_prompt_tokens:
                print(f"[{set_name}] {item['id']}: {len(prompt)} prompt tokens, skipped", flush=True)
                continue
            result = measure_item(model, prompt, sets, args.max_new_tokens, eos)
            copy = copy_predictions(prompt + result["tokens"], len(prompt))
            record = {"set": set_name, "family": tasks.family_of(set_name), "id": item["id"],
                      "prompt": prompt, **result, "copy": copy.tolist()}
            records.append(record)
            if args.records:
                with open(args.records, "a") as f:
                    f.write(json.dumps(record) + "\n")
            truth = np.array(result["tokens"])
            agree = {n: float((np.array(p) == truth).mean()) for n, p in result["preds"].items()}
            print(f"[{set_name}] {item['id']}: {len(prompt)}+{len(truth)} tokens, copy right "
                  f"{(copy == truth).mean():.2f}, agreement " + " ".join(f"{n.split(' (')[0]}={a:.2f}"
                                                                       for n, a in agree.items())
                  + f" ({time.perf_counter() - started:.0f}s)", flush=True)
    context_source = [t for r in records for t in r["prompt"] + r["tokens"]] or [1] * args.long
    costs = {}
    for label, n in (("short", args.short), ("long", args.long)):
        context = (context_source * (n // len(context_source) + 1))[:n]
        best = time_costs(model, context, sets, args.rounds)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        costs[label] = {"full_ms": best["full"] * 1e3, "load": load,
                        "relative": {name: best[name] / best["full"] for name in best if name != "full"}}
        print(f"cost at {n} tokens: full step {best['full'] * 1e3:.1f} ms; " + ", ".join(
            f"{name.split(' (')[0]} {v:.2f}" for name, v in costs[label]["relative"].items()), flush=True)
    report = render(args, records, sets, costs, num_layers)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    if args.json:
        Path(args.json).write_text(json.dumps({"records": records, "costs": costs,
                                               "sets": {n: list(k) for n, k in sets.items()}}))
    print(report)
    return 0


def agreement_rows(records, sets):
    """Per layer set: agreement overall, at copy breaks, per family; positions counted."""
    families = sorted({r["family"] for r in records})
    rows = {}
    for name in sets:
        hits = {"all": [0, 0], "break": [0, 0], **{f: [0, 0] for f in families}}
        for r in records:
            truth, pred, copy = np.array(r["tokens"]), np.array(r["preds"][name]), np.array(r["copy"])
            same, broken = pred == truth, copy != truth
            for key, mask in (("all", np.ones_like(same)), ("break", broken), (r["family"], np.ones_like(same))):
                hits[key][0] += int(same[mask].sum())
                hits[key][1] += int(mask.sum())
        rows[name] = {k: (h[0] / h[1] if h[1] else float("nan"), h[1]) for k, h in hits.items()}
    return rows, families


def render(args, records, sets, costs, num_layers) -> str:
    rows, families = agreement_rows(records, sets)
    positions = sum(len(r["tokens"]) for r in records)
    breaks = sum(int((np.array(r["copy"]) != np.array(r["tokens"])).sum()) for r in records)
    gammas = range(1, MAX_VERIFY)
    lines = [
        "# Self-speculation: shallow-layer agreement, cost and expected speed-up",
        "",
        f"Command: `{args.command_line}`",
        "",
        f"Model: {args.model} ({num_layers} layers), CPU float32, torch threads {args.threads or 'default'}. "
        f"{len(records)} items (the first {args.items} per set; prompts over {args.max_prompt_tokens} tokens skipped), "
        f"{positions} generated positions (at most {args.max_new_tokens} per item), of which {breaks} "
        f"({breaks / max(positions, 1):.0%}) are copy breaks (the longest earlier-seen suffix of 1..{MAX_SUFFIX} "
        "tokens has no match or predicts another token). See eval/selfspec.py for the method. Replayed "
        "tokens per cycle are exact for prefix depths; for skip sets they are optimistic (each position's "
        "prediction saw the full model's keys and values of the draft tokens before it, a drafter sees its own).",
        "",
        "## Agreement with the full model's greedy token",
        "",
        "| layers run | of " + str(num_layers) + " | overall | at copy breaks | "
        + " | ".join(families) + " | tokens/cycle, replayed (best g) |",
        "|---|---|---|---|" + "---|" * len(families) + "---|",
    ]
    for name, kept in sets.items():
        r = rows[name]
        replay = []
        for g in gammas:
            per_item = [replay_tokens_per_cycle(np.array(rec["preds"][name]) == np.array(rec["tokens"]), g)
                        for rec in records]
            replay.append((statistics.mean(per_item) if per_item else float("nan"), -g))
        best_tpc, best_g = max(replay)
        best_g = -best_g  # ties: the shortest draft
        lines.append(f"| {name} | {len(kept)} | {r['all'][0]:.3f} | {r['break'][0]:.3f} | "
                     + " | ".join(f"{r[f][0]:.3f}" for f in families) + f" | {best_tpc:.2f} (g={best_g}) |")
    lines += ["", "## Cost of one step, relative to one full one-token step", "",
              "| | " + " | ".join(f"{label} ({n} tokens)" for label, n in (("short", args.short), ("long", args.long)))
              + " |", "|---|---|---|",
              "| full step, ms | " + " | ".join(f"{costs[k]['full_ms']:.1f}" for k in ("short", "long")) + " |",
              "| machine load (1-min average, 2 cores) after | "
              + " | ".join(f"{costs[k].get('load') or float('nan'):.1f}" for k in ("short", "long")) + " |"]
    for name in list(sets) + [f"verify {q}" for q in range(2, MAX_VERIFY + 1)]:
        lines.append(f"| {name} | " + " | ".join(f"{costs[k]['relative'][name]:.2f}" for k in ("short", "long")) + " |")
    lines += ["", "## Expected speed-up over plain greedy, best draft length g", "",
              "Formula: S = E(g) / (g c + V(g+1)), c the shallow step's cost and V(q) the verify's (measured above), "
              "E(g) the tokens per verify: ((1 - a^(g+1)) / (1 - a)) from an agreement a (overall, or at copy breaks: "
              "what the shallow drafter serves beside the n-gram drafter), or replayed over the items' agreement "
              "sequences (exact for prefix depths; agreement comes in runs, so replay beats the formula). The last "
              "column assumes a free verify, V(q) = 1, as on a memory-bound GPU for small q (c from the short "
              "context). g counts from 1: below 1.00 plain decoding (g = 0) wins; at g = 1 drafting pays only where "
              "a > c + V(2) - 1.", "",
              "| layers run | a overall, short | a overall, long | a at breaks, short | a at breaks, long "
              "| replayed, short | replayed, long | replayed, verify free |",
              "|---|---|---|---|---|---|---|---|"]
    best = {}  # column -> (S, layer set, g)
    for name in sets:
        cells = []
        replayed = {g: statistics.mean(replay_tokens_per_cycle(np.array(rec["preds"][name]) == np.array(rec["tokens"]),
                                                               g) for rec in records) for g in gammas}
        columns = [(f"a {word}, {label}", label, (lambda g, a=rows[name][key][0]: expected_tokens(a, g)), False)
                   for key, word in (("all", "overall"), ("break", "at breaks")) for label in ("short", "long")]
        columns += [(f"replayed, {label}", label, replayed.__getitem__, False) for label in ("short", "long")]
        columns += [("replayed, verify free", "short", replayed.__getitem__, True)]
        for column, label, tokens, free in columns:
            rel = costs[label]["relative"]
            verify = {1: 1.0, **{q: 1.0 if free else rel[f"verify {q}"] for q in range(2, MAX_VERIFY + 1)}}
            s, g = max((tokens(g) / (g * rel[name] + verify[g + 1]), -g) for g in gammas)
            g = -g  # ties: the shortest draft
            best[column] = max(best.get(column, (0.0, "", 0)), (s, name, g))
            cells.append(f"{s:.2f} (g={g})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- best, {column}: {s:.2f}x ({name}, g={g})" for column, (s, name, g) in best.items()]
    measured = max(s for column, (s, _, _) in best.items() if "free" not in column)
    lines += ["", f"Best expected speed-up with the measured verify cost: {measured:.2f}x "
              + ("(pays)." if measured > 1.05 else "(does not pay on this machine).")]
    return "\n".join(lines) + "\n"

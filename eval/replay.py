"""`python -m eval replay TRACES`: drafters over recorded greedy traces, without the model.

Greedy output does not depend on the drafts, so replaying a trace gives exactly the target
forwards a real run would need. With a verify-cost curve (cost of a forward over q tokens
relative to one token) it also estimates the wall-clock speed-up over plain decoding.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import tasks
from ngramspec.cost.curves import DEFAULT_CPU_CURVE, CostCurve
from ngramspec.draft.config import SpeculatorConfig
from ngramspec.draft.replay import replay
from ngramspec.util.files import write_atomic

from .drafters import make_drafter
from .methods import REPLAY, MethodSpec, parse_methods
from .options import add_options, methods_of
from .oracle import ORACLE_MAX_DRAFT, oracle_replay, truth_sized_replay


def load_traces(path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _family(dataset: str) -> str:
    try:
        return tasks.family_of("spec_bench_cnndm" if dataset == "spec_bench" else dataset)
    except KeyError:
        return "other"


def replay_all(traces: list[dict], methods, cost: CostCurve, eos_token_ids=(), views=None, learned=None) -> dict:
    """{method name: {group: totals}} with groups per dataset, per family and "overall"
    (``methods``: text or parsed, eval/methods.py). ``views``: the target's features per trace
    (:func:`eval.target.capture`), for the ``ngramspec+LEAD`` methods; ``learned`` gets each
    such method's acceptance model."""
    results = {}
    for method in parse_methods(methods, REPLAY):
        name = method.name
        groups = defaultdict(lambda: defaultdict(float))
        oracle, truth_sized = method.kind == "oracle", method.kind == "truth-sized"  # upper bounds: eval/oracle.py
        leads, acceptance_model = (), None
        if "+" in method.kind:
            from .target import AcceptanceModel, parse_method

            if views is None:
                raise ValueError(f"{name}: the target-aware methods need the target's features: give --model")
            _, leads = parse_method(name)
            acceptance_model = AcceptanceModel()
            if learned is not None:
                learned[name] = acceptance_model
        if oracle:
            max_draft = method.typed({"k": ORACLE_MAX_DRAFT})["k"]
        else:
            # ngramspec sizes its drafts by the scoring curve unless its settings name a verify_cost
            scoring = SpeculatorConfig(verify_cost=cost.points) if method.kind.startswith("ngramspec") else None
            drafter = make_drafter(MethodSpec("ngramspec", method.settings) if truth_sized or leads else method,
                                   eos_token_ids, base=scoring)
        for number, trace in enumerate(traces):
            if oracle:
                tokens, forwards, total = oracle_replay(trace["prompt_ids"], trace["output_ids"], cost, max_draft)
            elif truth_sized:
                tokens, forwards, total = truth_sized_replay(drafter.start(trace["prompt_ids"]), trace["output_ids"],
                                                             cost)
            if oracle or truth_sized:
                drafted, drafter_s = tokens - forwards, 0.0  # every draft of a bound is accepted
                draft_steps, accepted = 0, 0  # not counted: bounds, not drafters
            else:
                if leads:
                    from .target import TargetAwareSession, reference_session

                    session = TargetAwareSession(reference_session(drafter, trace["prompt_ids"]), views[number], leads,
                                                 acceptance_model)
                else:
                    session = drafter.start(trace["prompt_ids"])
                result = replay(session, trace["output_ids"], cost)
                s = result.stats
                tokens, forwards, total = s.new_tokens, s.target_forwards, result.cost
                drafted, drafter_s = s.drafted_tokens, s.drafter_seconds
                draft_steps, accepted = s.steps_with_draft, s.accepted_tokens
            for group in (trace["dataset"], _family(trace["dataset"]), "overall"):
                g = groups[group]
                # a trace's own speed-up: the per-request worst case the totals hide
                g["worst"] = min(g.get("worst", math.inf), tokens / total if total else 1.0)
                g["below_1x"] += tokens < total
                g["items"] += 1
                g["tokens"] += tokens
                g["forwards"] += forwards
                g["cost"] += total
                g["drafted"] += drafted
                g["steps"] += max(0, forwards - 1)
                g["drafter_s"] += drafter_s
                g["draft_steps"] += draft_steps
                g["accepted"] += accepted
        results[name] = {
            group: {
                "items": int(g["items"]),
                "mat": g["tokens"] / g["forwards"],
                # vLLM's metric: tokens per verify pass over the steps that drafted (the oracle: -)
                "mat_drafted": 1 + g["accepted"] / g["draft_steps"] if g["draft_steps"] else None,
                "mean_draft": g["drafted"] / g["steps"] if g["steps"] else 0.0,
                "speedup": g["tokens"] / g["cost"],
                "worst": g["worst"],
                "below_1x": int(g["below_1x"]),
                "drafter_us_per_step": 1e6 * g["drafter_s"] / g["forwards"],
            }
            for group, g in groups.items()
        }
    return results


FAMILIES = ("summarization", "rewriting", "code_editing")


def summary_table(results: dict, baseline: str = "hf-pld") -> str:
    """One row per drafter: overall MAT and speed-up, and speed-up per family, each also as a
    ratio to ``baseline`` (when it was replayed too)."""
    base = results.get(baseline)
    header = ["drafter", "MAT", "MAT, drafted steps", "mean draft", "speed-up"] + [f"{f} speed-up" for f in FAMILIES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def cell(name: str, group: str) -> str:
        r = results[name]
        if group not in r:
            return "-"
        text = f"{r[group]['speedup']:.3f}x"
        if base is not None and group in base and name != baseline:
            text += f" ({r[group]['speedup'] / base[group]['speedup']:.2f}x {baseline})"
        return text

    for name, r in results.items():
        o = r["overall"]
        lines.append(f"| {name} | {o['mat']:.2f} | {_mat(o['mat_drafted'])} | {o['mean_draft']:.2f} | "
                     f"{cell(name, 'overall')} | "
                     + " | ".join(cell(name, f) for f in FAMILIES) + " |")
    return "\n".join(lines)


def _mat(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(results: dict, cost: CostCurve) -> str:
    groups = sorted({g for r in results.values() for g in r}, key=lambda g: (g == "overall", g))
    lines = [
        "Cost-weighted speed-up = new tokens / sum of verify costs, with cost(q) relative to a one-token "
        "forward: " + ", ".join(f"q={q}: {c:g}" for q, c in cost.points) + " (linear in between).",
        "",
        summary_table(results),
        "",
        "Per set and family:",
        "",
        "| group | drafter | items | MAT | MAT, drafted steps | mean draft | cost-weighted speedup | worst trace | "
        "traces below 1x | drafter us/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group in groups:
        for name, r in results.items():
            if group in r:
                s = r[group]
                lines.append(f"| {group} | {name} | {s['items']} | {s['mat']:.2f} | {_mat(s['mat_drafted'])} | "
                             f"{s['mean_draft']:.2f} | "
                             f"{s['speedup']:.3f}x | {s['worst']:.3f}x | {s['below_1x']} | "
                             f"{s['drafter_us_per_step']:.1f} |")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    add_options(parser, "traces", "methods", "out",
                methods={"default": "hf-pld,ngram,ngramspec", "type": methods_of(REPLAY),
                         "help": "comma-separated drafters: hf-pld (transformers' prompt lookup rule: n=2..1, "
                                 "left-most, 10 tokens, EOS cut), ngram[:min_n=5,max_n=5,k=5] (vLLM's rule: "
                                 "longest match, earliest occurrence), suffix[:k=24,cached=10000] "
                                 "(SuffixDecoding; needs .venv-vllm), ngramspec[:settings], oracle[:k=24] (an "
                                 "upper bound: any earlier copy, exact acceptance, cost-optimal sizes; "
                                 "eval/oracle.py), truth-sized[:settings] (ngramspec's drafts, each cut to what the "
                                 "target accepts: the bound of perfect sizing)"},
                out={"help": "write OUT.md and OUT.json"})
    parser.add_argument("--cost", default=None, type=CostCurve.parse,
                        help="verify-cost curve 'q:cost,...' relative to one token (default: the measured CPU curve)")
    parser.add_argument("--eos", default="2", help="EOS ids for hf-pld's EOS cut (default 2, SmolLM2's)")
    parser.add_argument("--model", default=None,
                        help="the target in the loop: one teacher-forced forward per trace gives the drafters of "
                             "ngramspec+source, ngramspec+acceptance (and both) the target's state and confidence "
                             "at every verified position ('default' or a model folder; see eval/target.py)")
    parser.add_argument("--states", default=None, help="with --model: an .npz that caches the forwards' features")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args) -> int:
    traces = load_traces(args.traces)
    cost = args.cost or DEFAULT_CPU_CURVE
    views, learned = None, {}
    if getattr(args, "model", None):  # the target in the loop: one teacher-forced forward per trace
        from ngramspec import load_model

        from .target import capture

        model, _ = load_model(args.model)
        views = capture(model, traces, Path(args.states) if args.states else None, quiet=args.quiet)
        del model
    results = replay_all(traces, args.methods, cost, eos_token_ids=tuple(int(t) for t in args.eos.split(",") if t),
                         views=views, learned=learned)
    text = markdown(results, cost)
    if "oracle" in results:
        from .target import oracle_shares

        text += "\n\n" + oracle_shares(results)
    if learned:
        from .target import acceptance_report

        text += "\n\n" + acceptance_report(learned)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out.with_suffix(".md"), f"# Replay of {args.traces}\n\n" + text + "\n")
        write_atomic(out.with_suffix(".json"), json.dumps(results, indent=1))
    return 0

"""Summaries, the markdown table and the plots of a harness run (from its JSONL records).

Speed-up of a method = greedy seconds / method seconds over the items both finished, so a
partial run still compares like with like. MAT = new tokens / target forwards (prefill
included: plain greedy is 1.00). Identity = output ids equal greedy's for the same item.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ngramspec.util.extras import require
from ngramspec.util.files import write_atomic


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def summarize_group(records: list[dict]) -> dict:
    """Per-method numbers for one group of records (one task, one family, or all)."""
    by_method = defaultdict(dict)
    for r in records:
        by_method[r["method"]][r["id"] if "task" not in r else (r["task"], r["id"])] = r
    greedy = by_method.get("greedy", {})
    out = {}
    for method, rows in by_method.items():
        keys = [k for k in rows if k in greedy]
        tokens = sum(rows[k]["new_tokens"] for k in rows)
        seconds = sum(rows[k]["seconds"] for k in rows)
        forwards = sum(rows[k]["forwards"] for k in rows)
        drafted_at, accepted_at = [], []
        drafter_s = 0.0
        for r in rows.values():
            stats = r.get("stats") or {}
            drafter_s += stats.get("drafter_seconds", 0.0)
            for j, (d, a) in enumerate(zip(stats.get("drafted_at", []), stats.get("accepted_at", []))):
                if j == len(drafted_at):
                    drafted_at.append(0)
                    accepted_at.append(0)
                drafted_at[j] += d
                accepted_at[j] += a
        greedy_s = sum(greedy[k]["seconds"] for k in keys)
        method_s = sum(rows[k]["seconds"] for k in keys)
        score_names = sorted({name for r in rows.values() for name in r.get("scores", {})})
        out[method] = {
            "items": len(rows),
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "speedup": greedy_s / method_s if method_s else None,
            "mat": tokens / forwards if forwards else None,
            "identical": _mean(rows[k]["output_ids"] == greedy[k]["output_ids"] for k in keys),
            "acceptance_by_position": [a / d for a, d in zip(accepted_at, drafted_at)] if drafted_at else [],
            "drafter_us_per_step": 1e6 * drafter_s / forwards if drafter_s and forwards else None,
            "scores": {name: _mean(r["scores"][name] for r in rows.values() if name in r.get("scores", {}))
                       for name in score_names},
        }
    return out


def summarize(records: list[dict]) -> dict:
    groups = {"task": defaultdict(list), "family": defaultdict(list)}
    for r in records:
        groups["task"][r["task"]].append(r)
        groups["family"][r["family"]].append(r)
    return {
        "tasks": {name: summarize_group(rows) for name, rows in groups["task"].items()},
        "families": {name: summarize_group(rows) for name, rows in groups["family"].items()},
        "overall": summarize_group(records),
    }


def _fmt(value, pattern="{:.2f}", missing="-"):
    return missing if value is None else pattern.format(value)


def markdown(summary: dict, meta: dict) -> str:
    lines = [f"Command: `{meta['command']}`", ""] if meta.get("command") else []
    lines += [
        f"Model `{meta.get('model')}`, {meta.get('device', 'cpu')}, torch {meta.get('torch')} with "
        f"{meta.get('torch_threads')} threads x {meta.get('processes', 1)} process(es), "
        f"{meta.get('max_new_tokens')} new tokens, greedy, batch 1.",
        "",
        "| group | method | items | tok/s | speedup vs greedy | MAT | identical | acceptance by position (1..4) "
        "| drafter us/step | quality |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sections = [(f"**{n}**", s) for n, s in sorted(summary["families"].items())]
    sections += sorted(summary["tasks"].items())
    sections.append(("**overall**", summary["overall"]))
    for group, methods in sections:
        for method in sorted(methods, key=lambda m: (m != "greedy", m)):
            s = methods[method]
            accept = " ".join(f"{a:.2f}" for a in s["acceptance_by_position"][:4]) or "-"
            quality = ", ".join(f"{k} {v:.3f}" for k, v in s["scores"].items() if v is not None) or "-"
            lines.append(
                f"| {group} | {method} | {s['items']} | {s['tokens_per_s']:.1f} | {_fmt(s['speedup'], '{:.2f}x')} | "
                f"{_fmt(s['mat'])} | {_fmt(s['identical'], '{:.0%}')} | {accept} | "
                f"{_fmt(s['drafter_us_per_step'], '{:.1f}')} | {quality} |"
            )
    if meta.get("configs"):
        lines += ["", "Settings: " + "; ".join(f"`{m}` = {c}" for m, c in meta["configs"].items())]
    return "\n".join(lines)


def plots(summary: dict, records: list[dict], out_dir: Path) -> list[Path]:
    """speedup.png (per task and method) and accepted_lengths.png (tokens per forward)."""
    matplotlib = require("matplotlib", "eval")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "eval")

    paths = []
    task_names = sorted(summary["tasks"])
    methods = sorted({m for s in summary["tasks"].values() for m in s if m != "greedy"})
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(task_names) + 2), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [summary["tasks"][t].get(method, {}).get("speedup") or 0 for t in task_names]
        ax.bar([x + i * width for x in range(len(task_names))], values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(task_names))], task_names,
                  rotation=30, ha="right")
    ax.set_ylabel("speed-up vs greedy (wall clock)")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "speedup.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in methods:
        emitted = [1 + a for r in records if r["method"] == method
                   for a in (r.get("stats") or {}).get("accepted_per_step", [])]
        if emitted:
            top = max(emitted)
            ax.hist(emitted, bins=range(1, top + 2), alpha=0.6, label=method, align="left", density=True)
    ax.set_xlabel("tokens emitted per verify forward (1 + accepted draft tokens)")
    ax.set_ylabel("share of forwards")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "accepted_lengths.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write(out_dir: Path, records: list[dict], meta: dict) -> dict:
    """summary.json, report.md and the plots, from every record of the run."""
    out_dir = Path(out_dir)
    summary = summarize(records)
    write_atomic(out_dir / "summary.json", json.dumps({"meta": meta, "summary": summary}, indent=1))
    write_atomic(out_dir / "report.md", markdown(summary, meta) + "\n")
    plots(summary, records, out_dir)
    return summary

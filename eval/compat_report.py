"""The compatibility table (`python -m eval compat`): compat.md, and README.md's "Supported
models" section, both made from the rows of eval/results/compat/compat.jsonl."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "eval" / "results" / "compat" / "compat.jsonl"
BEGIN, END = "<!-- compat:begin (python -m eval compat --readme) -->", "<!-- compat:end -->"

COLUMNS = ("build", "greedy", "hf_pld", "ngramspec", "sampling", "batch2")


def _cell(value) -> str:
    if value is None:
        return ""
    text = str(value)
    if text.startswith("DIFF"):
        return text
    head = text.split(":")[0]
    return head if head in ("refused", "CRASH", "n/a") else text


def render(rows: list[dict], settings, version: str, command: str) -> str:
    lines = [
        "# Compatibility: every model type transformers can load",
        "",
        f"transformers {version}, torch {torch.__version__}, CPU, float32 unless a column says otherwise.",
        f"Command: `{command}`",
        "",
        summary(rows),
        "",
        "Cells: `same` = identical to plain greedy with drafts accepted; `same, 0 acc` = identical but no draft "
        "was accepted; `DIFF` = a different output; `refused` = ngramspec's own error before the first forward; "
        "`CRASH` = any other exception; `n/a` = plain decoding itself cannot run it. ngramspec's MAT, drafted/"
        "accepted tokens and rollbacks (steps where drafted tokens were rejected and rolled back) are for the "
        "single row.",
        "",
        "| type | cache | " + " | ".join(COLUMNS) + " | MAT | drafted/acc | rollbacks | " + " | ".join(settings) + " |",
        "|" + "---|" * (len(COLUMNS) + 5 + len(settings)),
    ]
    for row in rows:
        stats = row.get("stats") or {}
        cells = [row["type"], row.get("cache", "")] + [_cell(row.get(c)) for c in COLUMNS]
        cells += [str(stats.get("mat", "")), f"{stats['drafted']}/{stats['accepted']}" if stats else "",
                  str(stats.get("rollbacks", ""))]
        cells += [_cell(row.get(s)) for s in settings]
        if row.get("cut_short"):
            cells[-1] += f" (cut short: {row['cut_short']})"
        lines.append("| " + " | ".join(cells) + " |")
    skipped = [r for r in rows if str(r.get("greedy", "")).startswith("n/a")]
    if skipped:
        lines += ["", "## Not applicable: plain decoding cannot run a text-only prompt", ""]
        lines += [f"- {r['type']} ({r.get('model', '?')}): {str(r['greedy'])[len('n/a: '):]}" for r in skipped]
    notes = [r for r in rows if any(str(r.get(c, "")).startswith(("refused", "CRASH")) for c in COLUMNS[1:])]
    if notes:
        lines += ["", "## Refusals and errors", ""]
        for row in notes:
            for column in COLUMNS[1:]:
                value = str(row.get(column, ""))
                if value.startswith(("refused", "CRASH")):
                    lines.append(f"- {row['type']} ({column}): {value}")
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> str:
    built = [r for r in rows if r.get("build") == "ok" and r.get("greedy") == "ok"]
    pld_same = [r for r in built if r.get("hf_pld") == "same"]
    ours = [r for r in built if str(r.get("ngramspec")).startswith("same")]
    verified = [r for r in built if r.get("ngramspec") == "same"]
    diff = sorted({r["type"] for r in rows for k, v in r.items()
                   if str(v).startswith("DIFF") and k != "hf_pld" and "(warned)" not in str(v)})
    warned = sorted({f"{r['type']} ({k})" for r in rows for k, v in r.items()
                     if str(v).startswith("DIFF") and "(warned)" in str(v)})
    crash = [r["type"] for r in built if any(str(r.get(c, "")).startswith("CRASH") for c in COLUMNS[3:])]
    return (f"{len(rows)} types: {len(built)} build and run plain greedy; transformers' prompt lookup is identical "
            f"on {len(pld_same)}; ngramspec is identical on {len(ours)} ({len(verified)} with drafts accepted, "
            f"{sum(r.get('ngramspec') == 'same' for r in pld_same)} of the {len(pld_same)}). "
            f"Different output anywhere: {', '.join(diff) or 'none'}"
            + (f" (and, after ngramspec's InexactPrecisionWarning, in {', '.join(warned)})" if warned else "")
            + ". "
            f"ngramspec crashes: {', '.join(crash) or 'none'}.")


def load_rows(path: Path = ROWS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _outcome(row: dict) -> str:
    if str(row.get("greedy", "")).startswith("n/a"):
        return "not text-only"
    if row.get("build") != "ok" or row.get("greedy") != "ok":
        return "not built"
    ours = str(row.get("ngramspec", ""))
    if ours.startswith("refused"):
        return "refused"
    if ours == "same" and row.get("batch2") in ("same", "same, 0 acc"):
        return "same"
    if ours.startswith("same"):
        return "same, no draft accepted" if ours == "same, 0 acc" else "same"
    return "other"


def readme_section(rows: list[dict]) -> str:
    """README.md's Supported models section: every type by outcome, from the sweep's rows."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(_outcome(row), []).append(row)
    lines = [BEGIN, "", summary(rows), "",
             "Every causal-LM type the installed transformers registers (and the image-text-to-text types, on "
             "a text-only prompt, and the encoder-decoder text-to-text types, rows \"TYPE (seq2seq)\") was built "
             "as a tiny random model from its own config and decoded by plain "
             "greedy `generate()`, transformers' prompt lookup and ngramspec side by side; the whole table, with "
             "sampling, a left-padded batch of 2 and the cache and attention settings, is "
             "`eval/results/compat/compat.md`.", ""]
    titles = {
        "same": "Identical to plain greedy, with drafts accepted and rolled back",
        "same, no draft accepted": "Identical, but the tiny random model accepted no draft (proves less)",
        "refused": "Refused before the first forward, with a message naming the type and what to do",
        "other": "Different or crashed (a bug: see the table)",
        "not text-only": "Not applicable: plain generate() cannot decode a text-only prompt on these (they need "
                         "an image or a document layout, are drafter heads of another model, or generate no tokens)",
        "not built": "Not built here (no valid tiny config, or a missing optional package)",
    }
    for key, title in titles.items():
        members = groups.get(key, [])
        if not members:
            continue
        lines.append(f"**{title}** ({len(members)}):")
        lines.append("")
        if key == "refused":
            reasons: dict[str, list[str]] = {}
            for row in members:
                reasons.setdefault(_reason(str(row["ngramspec"])), []).append(row["type"])
            lines += [f"- {', '.join(types)}: {reason}." for reason, types in reasons.items()]
        else:
            lines.append(", ".join(r["type"] for r in members))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def _reason(refusal: str) -> str:
    """The gist of a refusal message: its first clause, without the model's name."""
    text = refusal.split("UnsupportedGenerationError: ", 1)[-1]
    text = re.sub(r"^\S+ \(model type '[^']*'\) ", "", text)
    text = re.sub(r" for \S+ \(model type '[^']*'\)", "", text)
    cuts = [i for i in (text.find(m) for m in (". ", ", so ", ", which ", "; ", " (")) if i > 0]
    if cuts:
        return text[: min(cuts)]
    return text if text.endswith(".") else text.rsplit(" ", 1)[0] + " ..."  # stored messages are cut short


def update_readme(rows: list[dict], readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    readme.write_text(text[:start] + readme_section(rows) + text[end:], encoding="utf-8")

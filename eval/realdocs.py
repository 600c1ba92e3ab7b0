"""Real documents nobody here wrote: does `ngramspec rewrite` fix typos without harming the text?

    python -m eval realdocs --out eval/results/realdocs/suite          # 30 documents, ~25 min
    python -m eval realdocs --bounds --out eval/results/realdocs/bounds  # the guard's false stops

Documents are found on this machine at run time and never committed: READMEs and docs under
/usr/share/doc, standard-library and site-packages modules, and prose (licence texts, plain
text docs). Each is cut to an excerpt of at most ``--chars`` characters at a paragraph (code:
top-level block) boundary, typos are injected into its prose (code: into comments and
docstrings only) with a fixed seed, and the excerpt is rewritten with the CLI's defaults:

- **typos fixed**: injected typos whose original word is back in the output (word alignment);
- **new differences**: words that differ from the clean excerpt beyond the unfixed typos;
- **guarded**: chunks kept as they were by the drift guard; **parses**: Python before/after;
- **length ratio**: output / input characters;
- **speed-up**: plain greedy time / ngramspec time, summed over the chunks whose rewrite was
  used (the same chunks, greedy outputs identical; checked).

The table is rewritten after every document (``OUT.md``, ``OUT.jsonl``), so a run cut off
still leaves a result; ``--resume`` skips finished documents.

``--bounds`` measures the guard's rules on the shared rewriting and code-editing sets, whose
references are edits people made: how often a reference would have been stopped by the length
bound or the loop stop, or kept by the similarity floor and the growth limit.
"""

from __future__ import annotations

import difflib
import io
import json
import random
import re
import sys
import sysconfig
import tokenize
from pathlib import Path

from ngramspec.app.guard import parses_as_python

from .options import add_options

INSTRUCTIONS = {
    "code": "Fix the spelling mistakes in the comments and docstrings. Change nothing else.",
    "markdown": "Fix any spelling mistakes. Change nothing else.",
    "text": "Fix any spelling mistakes. Change nothing else.",
}
GROUPS = {"docs": 12, "stdlib": 7, "site-packages": 5, "prose": 6}  # documents per source, 30 in all
_WORD = re.compile(r"\w+|[^\w\s]")
_TYPO_WORD = re.compile(r"(?<![\w`/.\-])[a-z]{6,}(?![\w`/\-])")


# -- finding documents -------------------------------------------------------------------------
def _readable(path: Path, low: int = 1500, high: int = 200_000) -> str | None:
    try:
        if not low <= path.stat().st_size <= high:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if "\0" not in text and text.count("\n") >= 20 else None


def candidates(group: str) -> list[Path]:
    """Files of one group on this machine, sorted (the pick is then seeded)."""
    if group == "docs":
        root = Path("/usr/share/doc")
        paths = [p for p in root.rglob("*") if p.is_file() and (p.suffix in (".md", ".rst", ".markdown")
                                                              or p.name.startswith("README"))
                 and p.suffix not in (".gz", ".html")]
    elif group == "prose":
        paths = [p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file()]
        paths += [p for p in Path("/usr/share/doc").rglob("*.txt") if p.is_file()]
    elif group == "stdlib":
        paths = list(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    elif group == "site-packages":
        site = Path(sysconfig.get_paths()["purelib"])
        paths = [p for p in site.glob("*/*.py") if not p.name.startswith("_") and "test" not in str(p)]
    else:
        raise ValueError(f"unknown group {group!r}")
    return sorted(p for p in paths if not p.is_symlink())


def kind_of_path(path: Path) -> str:
    from ngramspec.app.chunking import kind_of

    kind = kind_of(str(path), "")
    if kind == "text" and path.suffix in ("", ".txt") and re.search(r"^#{1,6} \S", _readable(path) or "", re.M):
        return "markdown"
    return kind


def excerpt(text: str, kind: str, chars: int) -> str:
    """The longest prefix of ``text`` of at most ``chars`` characters that ends at a blank line
    (code: before a non-indented line after a blank line; the prefix must parse as Python)."""
    text = text.replace("\r\n", "\n").lstrip("\ufeff")
    cuts = [m.start() for m in re.finditer(r"\n\n(?=\S)" if kind == "code" else r"\n\n", text)]
    cuts = [c for c in cuts if c <= chars] or [min(len(text), chars)]
    for cut in reversed(cuts):
        piece = text[:cut].rstrip() + "\n"
        if kind != "code" or parses_as_python(piece):
            return piece
    return text[: cuts[0]].rstrip() + "\n"


def find_documents(seed: int = 0, chars: int = 2500, groups: dict | None = None) -> list[dict]:
    """``{path, group, kind, clean}`` for each picked document, in a seeded order."""
    rng = random.Random(seed)
    picked = []
    for group, count in (groups or GROUPS).items():
        pool = candidates(group)
        rng.shuffle(pool)
        taken = 0
        for path in pool:
            if taken == count:
                break
            raw = _readable(path)
            kind = kind_of_path(path)
            if raw is None or (kind == "code" and not parses_as_python(raw)):
                continue
            clean = excerpt(raw, kind, chars)
            if len(clean) < 800 or len(_typo_sites(clean, kind)) < 4:
                continue
            picked.append({"path": str(path), "group": group, "kind": kind, "clean": clean})
            taken += 1
    return picked


# -- typos -------------------------------------------------------------------------------------
def _prose_spans(text: str, kind: str) -> list[tuple[int, int]]:
    """Character ranges where typos may go: comments and docstrings of code; elsewhere every
    line outside fenced or indented code blocks, tables and link targets."""
    if kind == "code":
        spans, lines = [], text.splitlines(keepends=True)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.string[-3:] in ('"""', "'''")):
                (r0, c0), (r1, c1) = tok.start, tok.end
                spans.append((starts[r0 - 1] + c0, starts[r1 - 1] + c1))
        return spans
    spans, offset, fenced = [], 0, False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and not line.startswith(("    ", "\t")) and "|" not in line and "://" not in line:
            spans.append((offset, offset + len(line)))
        offset += len(line)
    return spans


def _typo_sites(text: str, kind: str) -> list[tuple[int, int]]:
    sites = []
    for start, end in _prose_spans(text, kind):
        sites += [(start + m.start(), start + m.end()) for m in _TYPO_WORD.finditer(text[start:end])]
    return sites


def inject_typos(clean: str, kind: str, seed: int, per_chars: int = 350) -> tuple[str, list[dict]]:
    """``clean`` with one typo per ``per_chars`` characters (at least 2, at most 10): two
    adjacent inner letters swapped in a lower-case word of 6+ letters. Returns the text and
    ``[{word, typo, start}]`` (start: offset in the returned text)."""
    rng = random.Random(seed)
    sites = _typo_sites(clean, kind)
    count = min(len(sites), max(2, min(10, len(clean) // per_chars)))
    chosen = sorted(rng.sample(sites, count))
    out, typos, last = [], [], 0
    for start, end in chosen:
        word = clean[start:end]
        for _ in range(10):
            i = rng.randrange(1, len(word) - 2)
            if word[i] != word[i + 1]:
                break
        typo = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        out.append(clean[last:start])
        typos.append({"word": word, "typo": typo, "start": sum(map(len, out))})
        out.append(typo)
        last = end
    out.append(clean[last:])
    return "".join(out), typos


def score_typos(clean: str, typoed: str, output: str, typos: list[dict]) -> dict:
    """Typos fixed (the original word is what the output has where the typo was) and new
    differences (output words that differ from the clean text, beyond the typos left)."""
    a, b = _WORD.findall(typoed), _WORD.findall(output)
    index = {len(_WORD.findall(typoed[: t["start"]])): t for t in typos}  # word position -> typo
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    fixed = 0
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            fixed += sum(1 for k in range(i1, i2) if k in index and index[k]["word"] in b[j1:j2])
    c = _WORD.findall(clean)
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in
                  difflib.SequenceMatcher(None, c, b, autojunk=False).get_opcodes() if tag != "equal")
    return {"typos": len(typos), "fixed": fixed, "new_differences": max(0, changed - (len(typos) - fixed))}


# -- the suite ---------------------------------------------------------------------------------
def run_document(job, plain_job, doc: dict, seed: int) -> dict:
    """One document through ngramspec (and plain greedy, for the speed-up): its row."""
    from ngramspec.app.documents import JobStats

    typoed, typos = inject_typos(doc["clean"], doc["kind"], seed)
    instruction = INSTRUCTIONS[doc["kind"]]
    job.stats = JobStats()
    output = job.rewrite(typoed, instruction, doc["kind"])
    row = {"path": doc["path"], "group": doc["group"], "kind": doc["kind"], "chars": len(typoed),
           "chunks": job.stats.chunks, "guarded": len(job.stats.guarded),
           "why": [why for _, why in job.stats.guarded], **score_typos(doc["clean"], typoed, output, typos),
           "length_ratio": round(len(output) / len(typoed), 3)}
    if doc["kind"] == "code":
        row["parses"] = [parses_as_python(typoed), parses_as_python(output)]
    used = [c for c in job.stats.per_chunk if c["written"] and not c["looped"]]
    row["spec_seconds"] = round(sum(c["seconds"] for c in used), 3)
    row["new_tokens"] = sum(c["new_tokens"] for c in used)
    if plain_job is not None:
        plain_job.stats = JobStats()
        plain_output = plain_job.rewrite(typoed, instruction, doc["kind"])
        row["identical"] = plain_output == output
        row["plain_seconds"] = round(sum(p["seconds"] for p, c in zip(plain_job.stats.per_chunk, job.stats.per_chunk)
                                         if c["written"] and not c["looped"]), 3)
    return row


def summary(rows: list[dict]) -> dict:
    typos, fixed = sum(r["typos"] for r in rows), sum(r["fixed"] for r in rows)
    code = [r for r in rows if "parses" in r and r["parses"][0]]
    spec = sum(r["spec_seconds"] for r in rows)
    plain = sum(r.get("plain_seconds", 0.0) for r in rows)
    return {"documents": len(rows), "chunks": sum(r["chunks"] for r in rows),
            "guarded": sum(r["guarded"] for r in rows), "typos": typos, "fixed": fixed,
            "fixed_share": round(fixed / typos, 3) if typos else 0.0,
            "new_differences": sum(r["new_differences"] for r in rows),
            "code_still_parsing": f"{sum(r['parses'][1] for r in code)}/{len(code)}",
            "max_length_ratio": max((r["length_ratio"] for r in rows), default=0.0),
            "speedup_used_chunks": round(plain / spec, 3) if spec and plain else None,
            "identical": all(r.get("identical", True) for r in rows)}


def write_table(rows: list[dict], out: Path, header: str) -> None:
    s = summary(rows)
    lines = [header, "", "| document | kind | chunks | guarded | typos fixed | new diffs | parses | length | "
             "speed-up |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parses = "" if "parses" not in r else "/".join("yes" if p else "no" for p in r["parses"])
        timed = r.get("plain_seconds") and r["spec_seconds"]
        speed = f"{r['plain_seconds'] / r['spec_seconds']:.2f}x" if timed else "-"
        lines.append(f"| {r['path']} | {r['kind']} | {r['chunks']} | {r['guarded']} | {r['fixed']}/{r['typos']} | "
                     f"{r['new_differences']} | {parses} | {r['length_ratio']:.2f} | {speed} |")
    lines += ["", "Summary: " + json.dumps(s), ""]
    reasons: dict[str, int] = {}
    for r in rows:
        for why in r["why"]:
            key = re.sub(r"[\d.]+", "N", why)
            reasons[key] = reasons.get(key, 0) + 1
    lines += ["Guarded chunks by reason: " + json.dumps(reasons), ""]
    out.with_suffix(".md").write_text("\n".join(lines))


def run_suite(args) -> int:
    import torch
    from tqdm import tqdm

    from ngramspec import NgramSpeculator, SpeculatorConfig, load_model
    from ngramspec.app.documents import DocumentJob

    if args.threads:
        torch.set_num_threads(args.threads)
    docs = find_documents(args.seed, args.chars)[: args.limit]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if args.resume and jsonl.exists() else []
    if not args.resume:
        jsonl.write_text("")
    done = {r["path"] for r in rows}
    model, tokenizer = load_model(args.model)
    settings = dict(chunk_tokens=args.chunk_tokens)
    job = DocumentJob(model, tokenizer, NgramSpeculator(SpeculatorConfig()), **settings)
    plain = None if args.no_plain else DocumentJob(model, tokenizer, None, **settings)
    header = (f"Real documents (found at run time on this machine), default model, greedy, torch threads "
              f"{torch.get_num_threads()}, seed {args.seed}, excerpts of at most {args.chars} characters.\n\n"
              f"Command: `{args.command_line}`")
    for i, doc in enumerate(tqdm(docs, desc="realdocs", file=sys.stderr, disable=args.quiet)):
        if doc["path"] in done:
            continue
        row = run_document(job, plain, doc, args.seed + i)
        rows.append(row)
        with jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        write_table(rows, out, header)
        print(json.dumps({k: row[k] for k in ("path", "guarded", "fixed", "typos", "new_differences",
                                               "length_ratio")}), file=sys.stderr, flush=True)
    print(json.dumps(summary(rows)))
    return 0


# -- the guard's false stops on references ------------------------------------------------------
BOUND_SETS = ("jfleg", "asset", "iterater_human", "humanevalfix", "quixbugs", "editeval_instructcoder")


def bounds(args) -> int:
    """Per set: share of references (people's edits) the guard's rules would stop or keep."""
    import tasks
    from ngramspec.app.guard import length_bound, longest_periodic_stretch, loop_allowance, similarity
    from ngramspec.app.settings import JobSettings
    from ngramspec.models import load_model

    settings = JobSettings()

    _, tokenizer = load_model(args.model)
    lines = ["How often the guard's rules would stop or discard a person's edit: each reference of the "
             "shared rewriting and code-editing sets against its source, with the defaults "
             f"(the similarity floor the set's instruction calls for: {settings.correction_floor} for corrections, "
             f"{settings.rewording_floor} for rewording; max growth {settings.max_growth}).", "",
             f"Command: `{args.command_line}`", "",
             "| set | pairs | loop stop | length bound (stops) | similarity < floor | longer than max growth | "
             "any rule |", "|---|---|---|---|---|---|---|"]
    for name in BOUND_SETS:
        counts = [0, 0, 0, 0, 0]
        pairs = 0
        for item in tasks.load_items(name, args.data_dir):
            source_ids = tokenizer(item["source"], add_special_tokens=False)["input_ids"]
            allowance = loop_allowance(source_ids, settings)
            for ref in item["references"]:
                ref_ids = tokenizer(ref, add_special_tokens=False)["input_ids"]
                hits = [longest_periodic_stretch(ref_ids, settings.max_period) > allowance,
                        len(ref_ids) >= length_bound(len(source_ids), settings),
                        similarity(item["source"], ref) < settings.floor(item["instruction"]),
                        len(ref) > settings.max_growth * len(item["source"]) + settings.growth_slack_chars]
                pairs += 1
                for k, hit in enumerate(hits + [any(hits)]):
                    counts[k] += hit
        lines.append(f"| {name} | {pairs} | " + " | ".join(f"{100 * c / pairs:.1f}%" for c in counts) + " |")
        print(lines[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


def add_arguments(p) -> None:
    add_options(p, "out", "model", "limit",
                out={"required": True, "help": "writes OUT.md (table) and OUT.jsonl (rows)"},
                limit={"default": sum(GROUPS.values()), "help": "documents (default: all %(default)s)"})
    p.add_argument("--chars", type=int, default=2500, help="excerpt length, characters (default 2500)")
    p.add_argument("--seed", type=int, default=0, help="which documents and typos (default 0)")
    p.add_argument("--chunk-tokens", type=int, default=None, help="chunk size (default: the CLI's)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain greedy run (no speed-up column)")
    p.add_argument("--resume", action="store_true", help="skip documents already in OUT.jsonl")
    p.add_argument("--bounds", action="store_true", help="the guard's rules on the shared sets' references instead")
    add_options(p, "threads", "data_dir", "quiet", threads={"help": "torch CPU threads (default: torch's choice)"},
                data_dir={"help": "shared data directory (for --bounds)"})


def main(args) -> int:
    if args.chunk_tokens is None:
        from ngramspec.app.settings import JobSettings

        args.chunk_tokens = JobSettings().chunk_tokens
    return bounds(args) if args.bounds else run_suite(args)

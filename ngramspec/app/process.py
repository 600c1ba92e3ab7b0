"""One share of a run: each document rewritten or summarized with its chunks saved as they
finish (``--resume``), its output locked and written (or printed, or diffed), and the errors
the command reports as one line (:mod:`ngramspec.app.cli` maps them to exit codes).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from ..util.files import RecordLog, apply_style, exclusive_lock, split_style, write_output, write_target


class CliError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback."""


class DegenerateError(Exception):
    """The model's output degenerated and was refused: one line, exit code 4."""


class WriteError(Exception):
    """An output that could not be written (disk full, no permission): one line, exit code 1."""



class ResumeState:
    """Finished chunks of one (input, command, instruction, model, settings) run: a record log
    (one line per chunk, ``index`` -1 marks an in-place file as rewritten) under the cache."""

    def __init__(self, key_parts: dict):
        from ..util.files import cache_dir

        key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:24]
        self.log = RecordLog(cache_dir() / "resume" / f"{key}.jsonl")
        self.done: dict[int, str] = {}
        self.kept: dict[int, str] = {}

    def load(self) -> dict[int, str]:
        records = [r for r in self.log.read() if "index" in r and "text" in r]
        self.done = {int(r["index"]): r["text"] for r in records}
        self.kept = {int(r["index"]): r["kept"] for r in records if r.get("kept")}  # index -> why
        return self.done

    def save(self, index: int, text: str, kept: str = "") -> None:
        self.done[index] = text
        self.log.append({"index": index, "text": text, **({"kept": kept} if kept else {})})

    def clear(self) -> None:
        self.log.clear()



def output_path(args, path: str) -> Path | None:
    """Where the result for input ``path`` goes (None: stdout, or a --diff)."""
    if getattr(args, "in_place", False):
        return Path(path)
    if args.out_dir is not None:
        return Path(args.out_dir) / Path(path).name
    return None if args.output is None else Path(args.output)


def _resume_state(args, text: str, kind: str, config) -> ResumeState:
    return ResumeState({"input": hashlib.sha256(text.encode()).hexdigest(), "command": args.command,
                        "instruction": args.instruction, "model": args.model, "config": repr(config),
                        "sample": args.sample, "temperature": args.temperature, "seed": args.seed,
                        "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens, "kind": kind,
                        "guard": [getattr(args, "keep_drifted", None), getattr(args, "max_growth", None)]})


def _kind(args, path: str, text: str) -> str:
    from .chunking import kind_of

    return kind_of(None if path == "-" else path, text) if args.kind == "auto" else args.kind


def _finished_in_place(args, path: str, text: str, config, resume_only: bool = True) -> ResumeState | None:
    """--in-place --resume after an interruption: the resume state of this file when it was
    rewritten already (its .bak holds the original, whose state marks the file's content as
    the finished result), else None."""
    backup = Path(path + ".bak")
    if not (getattr(args, "in_place", False) and (args.resume or not resume_only) and backup.is_file()):
        return None
    original = split_style(backup.read_bytes().decode("utf-8"))[0]
    state = _resume_state(args, original, _kind(args, path, original), config)
    return state if state.load().get(-1) == _digest(text) else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lock_output(args, path: str, locks: contextlib.ExitStack) -> None:
    """Hold the lock of input ``path``'s output file until ``locks`` closes. Outputs written
    through (stdout, devices) are written once, in one go, and take none."""
    output = output_path(args, path)
    target = None if output is None else write_target(output)
    if target is None:
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        locks.enter_context(exclusive_lock(target.parent / f".{target.name}.lock"))
    except BlockingIOError:
        raise CliError(f"another ngramspec run is writing {output}; wait for it to end, then rerun") from None
    except OSError as err:
        raise WriteError(f"cannot write {output}: {err.strerror or err}") from None


def _write(path: Path, text: str) -> None:
    try:
        write_output(path, text)
    except OSError as err:
        raise WriteError(f"cannot write {path}: {err.strerror or err}") from None


def write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as err:
        raise WriteError(f"cannot write to stdout: {err.strerror or err}") from None


def _diff(old: str, new: str, name: str) -> str:
    """A unified diff of ``old`` to ``new``, both headed ``name``; a last line without a line
    break gets diff's "No newline at end of file" marker, so the diff still applies."""
    lines = difflib.unified_diff(_lines(old), _lines(new), name, name)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _lines(text: str) -> list[str]:
    """Lines split at LF only (str.splitlines also splits at form feeds and other breaks)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def check_saved_progress(args, raws: list[str], mine: list[int], config) -> None:
    """Before the model loads: a run without --resume or --restart that finds chunks an earlier
    run of the same job saved refuses, rather than drop them."""
    if args.resume and getattr(args, "restart", False):
        raise CliError("give --resume (continue from saved chunks) or --restart (discard them), not both")
    if args.resume or getattr(args, "restart", False):
        return
    for i in mine:
        path = args.inputs[i]
        text = split_style(raws[i])[0]
        if _finished_in_place(args, path, text, config, resume_only=False) is not None:
            raise CliError(f"{path} was rewritten in place by an earlier run that did not finish (its original "
                           f"is {path}.bak); rerun with --resume to finish the run, or --restart to rewrite it again")
        saved = len([k for k in _resume_state(args, text, _kind(args, path, text), config).load() if k >= 0])
        if saved:
            raise CliError(f"{path}: an earlier run of this command saved {saved} finished chunk(s); rerun with "
                           "--resume to continue from them, or --restart to discard them and start over")


def verdict_line(args, path: str, index: int, total: int, verdict) -> str:
    """The stderr line saying what became of chunk ``index`` (of ``total``) of ``path``."""
    where = f"ngramspec {args.command}: {path}: chunk {index + 1}/{total}"
    earlier = " resumed from an earlier run," if verdict.resumed else ""
    if args.command == "summarize":
        return f"{where} {'resumed from an earlier run' if verdict.resumed else 'summarized'}"
    if verdict.kept:
        why = verdict.why
        if "similarity" not in why and verdict.rewrite_similarity is not None:
            why += f"; similarity {verdict.rewrite_similarity:.3f}"
        return f"{where}{earlier} kept as it was: its rewrite drifted ({why}); --keep-drifted 0 uses it anyway"
    return f"{where}{earlier} rewritten (similarity {verdict.similarity:.3f})"


def _process(args, job, path: str, raw: str, config, bar, show: str) -> ResumeState:
    """Rewrite or summarize one document (``raw``: as read) and write its output; returns its
    resume state (cleared by the caller once the whole run is done). ``show``: "kept" to print
    each rewritten chunk's final text to stdout once it is decided, "raw" when the model's raw
    stream goes there, "" for neither."""
    from tqdm import tqdm

    from .documents import DegenerateOutput

    text, style = split_style(raw)
    kind = _kind(args, path, text)
    state = _resume_state(args, text, kind, config)
    done = state.load() if args.resume else {}
    if not args.resume:
        state.clear()
    output = output_path(args, path)
    total = len(job.chunks(text, kind)) if args.command == "rewrite" else len(
        [c for c in job.chunks(text, kind) if c.body])
    shown = []  # the text printed so far (show == "kept")

    def on_chunk(index, chunk, body):
        verdict = job.stats.verdicts.get(index)
        if index not in done:
            state.save(index, body, verdict.why if verdict is not None and verdict.kept else "")
        if verdict is not None and (verdict.kept or not args.quiet):
            tqdm.write(verdict_line(args, path, index, total, verdict), file=sys.stderr)
        if args.command == "rewrite" and output is None and show == "raw":
            sys.stdout.write(chunk.trail)  # the blank lines between chunks
            sys.stdout.flush()
        elif args.command == "rewrite" and output is None and show == "kept":
            piece = apply_style(chunk.lead + body + chunk.trail, replace(style, bom=style.bom and not shown))
            shown.append(piece)
            write_stdout(piece)
        bar.update(1)
        stats = job.stats  # speed over the chunks whose rewrite was used
        if stats.used_seconds:
            bar.set_postfix(tok_s=f"{stats.new_tokens / stats.used_seconds:.1f}", mat=f"{stats.mat:.2f}",
                            kept=len(stats.guarded))

    if args.command == "rewrite":
        result = job.rewrite(text, args.instruction, kind, done=done, on_chunk=on_chunk, done_kept=state.kept)
    else:
        try:
            result = job.summarize(text, args.instruction, kind, done=done, on_chunk=on_chunk)
        except DegenerateOutput as err:
            raise DegenerateError(f"{path}: summary refused, nothing written: {err}; --accept-loops writes "
                                  "it anyway") from None

    result = apply_style(result, style)
    if getattr(args, "diff", False):
        job.diff = _diff(raw, result, path)  # printed by the first process, in input order, at the end
    elif getattr(args, "in_place", False):
        _write(Path(path + ".bak"), raw)
        state.save(-1, _digest(split_style(result)[0]))  # marks it done for --resume (which reads it back)
        _write(Path(path), result)
    elif output is not None:
        _write(output, result)
    elif show == "kept" and args.command == "rewrite":
        printed = "".join(shown)
        if not result.startswith(printed):  # never expected: the document is the chunks joined
            raise WriteError("the text printed so far differs from the document; rerun with -o FILE")
        write_stdout(result[len(printed):])
    elif show != "raw":
        write_stdout(result)
    elif not result.endswith("\n"):
        write_stdout("\n")
    return state


def process_share(args, job, raws: list[str], mine: list[int], config, processes,
                  show: str) -> tuple[list, list]:
    """This process's share ``mine`` of the documents, each processed and written: (its stats
    records, the resume states to clear once every process is done)."""
    from tqdm import tqdm

    from .documents import JobStats

    texts = {i: split_style(raws[i])[0] for i in mine}
    finished = {i: _finished_in_place(args, args.inputs[i], texts[i], config) for i in mine}
    states = [resume for resume in finished.values() if resume is not None]  # cleared at the end too
    mine = [i for i in mine if finished[i] is None]
    chunk_lists = {i: job.chunks(texts[i], _kind(args, args.inputs[i], texts[i])) for i in mine}
    total = sum(len(c) if args.command == "rewrite" else sum(1 for x in c if x.body) for c in chunk_lists.values())
    bar = tqdm(total=total, unit="chunk", file=sys.stderr, disable=args.quiet,
               desc=f"{args.command}[{processes.rank}]" if processes.world > 1 else args.command)
    records = []
    try:
        for i in mine:
            job.stats = JobStats()  # per document (sampling seeds too, so a split run equals a whole one)
            states.append(_process(args, job, args.inputs[i], raws[i], config, bar, show))
            records.append({"input": args.inputs[i], "process": processes.rank, **job.stats.as_dict()})
            if getattr(args, "diff", False):
                records[-1]["diff"] = job.diff
    finally:
        bar.close()
    return records, states

"""`ngramspec rewrite|summarize`: fix, restyle, simplify or summarize a document, fast.

    ngramspec rewrite notes.md --instruction "Fix grammar and spelling." -o fixed.md
    ngramspec rewrite app.py --instruction "Add type hints." --in-place      # keeps app.py.bak
    cat report.txt | ngramspec summarize - --stats

Long documents are split along natural boundaries (Markdown sections, top-level code blocks,
paragraphs), each chunk is rewritten with the instruction, and the results are joined with the
document's own blank lines and indentation. Without -o, stdout shows each chunk's final text
once the guard has decided on it (--stream-raw: the model's raw output as it comes); stderr
gets a progress bar (chunks, tokens/s, mean accepted tokens per forward) and one line per chunk
as it is decided: rewritten or kept, why, its similarity.

Many documents at once, into a folder (or --in-place), sharded over processes or GPUs:

    ngramspec rewrite docs/*.md --instruction "Fix typos." --out-dir fixed/
    accelerate launch --multi_gpu --num_processes 2 -m ngramspec rewrite docs/*.md ... --out-dir fixed/

Under `accelerate launch` each process takes a share of the documents (balanced by size) and
the first process prints the merged summary (on a machine without CUDA the processes run on
CPU, each with cores / processes torch threads).

Safety: the input is never overwritten unless --in-place, which writes atomically and keeps a
.bak copy. Output files are written atomically at the end, so an interrupted run leaves the
input untouched and no half-written output; finished chunks are saved as they complete, and
--resume continues from them (with many documents, finished documents are skipped); a rerun
that finds them without --resume refuses (--restart discards them). SIGTERM and SIGHUP act as
Ctrl-C. Output paths are checked before the model loads. An output
that is a symlink keeps being one (its target is replaced); a device, FIFO or /dev/stdout is
written through. A run locks its output files (.NAME.lock beside each): a second run on the same
output stops at once (exit 2). A failed write (disk full) exits 1 and leaves the old file whole.

Trust: a small model sometimes answers with something else than the text (a chat reply,
invented code, one line repeated until the token limit). Each chunk's generation stops once
it repeats a span many times over where the input does not, or runs past the length bound;
a rewritten chunk that drifted (similarity below --keep-drifted, longer than --max-growth,
Markdown headings/lists/fences/front matter or Python syntax broken) is kept as it was, with a
line on stderr even under --quiet. A summary that loops is refused: nothing is written, unless
--accept-loops.

Exit status: 0 done; 1 a write failed; 2 bad usage; 3 done, but some chunks were kept as they
were (the output is written; stderr names them); 4 a summary degenerated (nothing written);
130 interrupted (Ctrl-C; 143 SIGTERM, 129 SIGHUP).

Fidelity: the model sees LF line breaks and no byte-order mark; the output gets the input's
back (CRLF, BOM), and a rewrite keeps the input's trailing newline, or its absence.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from ..util.files import write_target
from . import options
from .jobs import start_processes
from .process import (
    CliError,
    DegenerateError,
    WriteError,
    check_saved_progress,
    lock_output,
    output_path,
    process_share,
    write_stdout,
)
from .settings import JobSettings

EXIT_FAILED, EXIT_USAGE, EXIT_GUARDED, EXIT_DEGENERATE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
LARGER_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"  # what the no-rewrite message suggests
JOB_OPTIONS = options.JOB_OPTIONS


def build_parser(full: bool = False) -> argparse.ArgumentParser:
    """The command's parser (``options.py``): --help lists the common path, ``full`` every option."""
    return options.build_parser(full, __doc__)


def read_input(path: str) -> str:
    if path == "-":
        data = sys.stdin.buffer.read()
        name = "stdin"
    else:
        file = Path(path)
        if not file.exists():
            raise CliError(f"{path}: no such file")
        if file.is_dir():
            raise CliError(f"{path} is a directory; give a text, Markdown or code file")
        data = file.read_bytes()
        name = path
    if b"\0" in data[:8192]:
        raise CliError(f"{name} looks binary (it contains NUL bytes); give a text, Markdown or code file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{name} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise CliError(f"{name} is empty; nothing to {'do'}")
    return text


def _check_args(args) -> None:
    if args.instruction is not None and not args.instruction.strip():
        raise CliError("the instruction is empty; say what to do, e.g. --instruction \"Fix the grammar.\"")
    inputs, in_place, diff = args.inputs, getattr(args, "in_place", False), getattr(args, "diff", False)
    if diff and (args.output is not None or args.out_dir is not None or in_place):
        raise CliError("--diff prints to stdout and writes nothing; drop -o/--output, --out-dir and --in-place")
    job_settings(args)  # --keep-drifted, --max-growth, --chunk-tokens: checked as JobSettings checks them
    if len(set(inputs)) != len(inputs):
        raise CliError("an input is given twice")
    if "-" in inputs and len(inputs) > 1:
        raise CliError("'-' (stdin) can only be the one input")
    if (args.output is not None) + (args.out_dir is not None) + in_place > 1:
        raise CliError("give one of -o/--output, --out-dir and --in-place")
    if in_place and "-" in inputs:
        raise CliError("--in-place needs a file, not stdin")
    if len(inputs) > 1 and args.output is not None:
        raise CliError("-o/--output takes one input; with several, use --out-dir DIR or --in-place")
    if len(inputs) > 1 and args.out_dir is None and not in_place and not diff:
        raise CliError("several inputs need --out-dir DIR (one output per input), --in-place or --diff")
    if args.output is not None:
        _check_output(Path(args.output), inputs, "-o")
    if args.stream_raw and (diff or len(inputs) > 1 or args.out_dir is not None):
        raise CliError("--stream-raw shows one document as it is generated: not with --diff, --out-dir or "
                       "several inputs")
    if args.out_dir is not None:
        if Path(args.out_dir).exists() and not Path(args.out_dir).is_dir():
            raise CliError(f"--out-dir {args.out_dir} is a file, not a folder")
        names = [Path(x).name for x in inputs]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise CliError(f"several inputs are named {clash[0]!r}; their outputs would collide in --out-dir")
        if "-" in inputs:
            raise CliError("--out-dir needs file inputs (their names name the outputs), not stdin")
        for x in inputs:
            if (Path(args.out_dir) / Path(x).name).resolve() == Path(x).resolve():
                raise CliError(f"the output for {x} would overwrite it; choose another --out-dir or pass --in-place")
            _check_output(Path(args.out_dir) / Path(x).name, [x], "--out-dir")
    if in_place:
        for x in inputs:
            _check_output(Path(x), [], "--in-place")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be at least 1")
    if args.temperature <= 0:
        raise CliError("--temperature must be > 0")


def _check_output(path: Path, inputs: list[str], option: str) -> None:
    """Before the model loads: ``path`` can take an output (not a folder, in a folder that
    exists and takes new files) and is not one of ``inputs`` (hard links too)."""
    if path.is_dir():
        raise CliError(f"{option} {path} is a folder; give a file name" + (
            f" (or --out-dir {path}: one output per input)" if option == "-o" else ""))
    target = write_target(path)
    if target is None:  # a device or FIFO, written through
        return
    for x in inputs:
        if x != "-" and (target.resolve() == Path(x).resolve() or target.exists() and os.path.samefile(target, x)):
            raise CliError("the output would overwrite the input; pass --in-place to replace it (a .bak is kept)")
    folder = target.resolve().parent
    if option == "--out-dir":  # created when missing: its nearest existing parent takes it
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.is_dir():
        raise CliError(f"{path}: its folder does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise CliError(f"{path}: cannot write in its folder {folder} ({err.strerror or err})") from None


def job_settings(args) -> JobSettings:
    """The JobSettings of the options in JOB_OPTIONS (summarize has no drift options: their
    defaults); a bad value is a usage error naming the option."""
    given = {name: getattr(args, dest) for name, (_, dest) in JOB_OPTIONS.items() if hasattr(args, dest)}
    try:
        return JobSettings(**given)
    except (TypeError, ValueError) as err:
        message = str(err)
        for name, (flag, _) in JOB_OPTIONS.items():
            message = message.replace(f"JobSettings.{name} ", f"{flag} ")
        raise CliError(message) from None


def shard_by_size(sizes: list[int], processes: int) -> list[list[int]]:
    """Indices of ``sizes`` split over ``processes``: largest first, each to the least-loaded
    process (ties: the lower rank), so every process computes the same split without talking."""
    loads, shards = [0] * processes, [[] for _ in range(processes)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(processes), key=lambda r: (loads[r], r))
        shards[rank].append(i)
        loads[rank] += sizes[i]
    return [sorted(shard) for shard in shards]


def _speculator_config(args):
    """The SpeculatorConfig of --config, --set and the --min-n ... options (bad values are usage errors)."""
    try:
        return options.speculator_config(args)
    except options.OptionError as err:
        raise CliError(str(err)) from None


def _document_job(args, config, device: str | None, raw_stream: bool):
    """The model, loaded on ``device``, and the job that rewrites or summarizes with it."""
    from ..draft.speculator import NgramSpeculator
    from ..hf.models import ModelNotFoundError, load_model
    from .documents import DocumentJob

    try:
        with _transformers_quiet(args.quiet):
            model, tokenizer = load_model(args.model, device=device)
    except (ModelNotFoundError, OSError, ValueError) as err:
        raise CliError(f"cannot load model {args.model!r}: {str(err).splitlines()[0]}") from None
    streamer_factory = None
    if raw_stream:
        from transformers import TextStreamer

        streamer_factory = lambda: TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)  # noqa: E731
    try:
        return DocumentJob(model, tokenizer, None if args.no_speculation else NgramSpeculator(config),
                           max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                           seed=args.seed, streamer_factory=streamer_factory, settings=job_settings(args),
                           accept_loops=getattr(args, "accept_loops", False))
    except ValueError as err:  # a model the document tool cannot prompt
        raise CliError(f"cannot use model {args.model!r}: {err}") from None


@contextlib.contextmanager
def _transformers_quiet(quiet: bool):
    """With ``quiet``, transformers' progress bars ("Loading weights") and warnings are off for
    the block, then as they were (main() runs in-process too, in tests)."""
    from transformers.utils import logging

    if not quiet:
        yield
        return
    bars, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def run(args) -> int:
    _check_args(args)
    raws = [read_input(path) for path in args.inputs]  # every input checked before the model loads
    config = _speculator_config(args)
    # Several documents, or a launch over processes: accelerate shares them out. One document
    # needs no process group (and is the only case that shows its text on stdout as it goes).
    many = len(args.inputs) > 1 or args.out_dir is not None or int(os.environ.get("WORLD_SIZE", "1")) > 1
    check_saved_progress(args, raws, list(range(len(raws))), config)  # every document: all processes refuse alike
    processes = start_processes(args.threads, distributed=many)
    if processes.busy and not args.quiet:
        print(f"ngramspec {args.command}: other processes keep cores busy: {processes.threads} torch "
              f"thread{'s' if processes.threads > 1 else ''} (--threads N overrides)", file=sys.stderr)
    mine = shard_by_size([len(t) for t in raws], processes.world)[processes.rank]
    to_stdout = not many and not getattr(args, "diff", False) and output_path(args, args.inputs[0]) is None
    # stdout shows each chunk's final text once decided ("kept": a terminal; a pipe gets the
    # document at the end), or with --stream-raw the model's raw output as it comes
    show = "raw" if args.stream_raw else "kept" if to_stdout and _is_terminal() else ""
    with contextlib.ExitStack() as locks:  # this process's outputs, before the model loads
        for i in mine:
            lock_output(args, args.inputs[i], locks)
        job = _document_job(args, config, processes.device, show == "raw")
        records, states = process_share(args, job, raws, mine, config, processes, show)
        records = processes.gather(records)  # every process's documents, on every process
        processes.close()
        records = sorted(records, key=lambda r: args.inputs.index(r["input"]))
        diffs = [r.pop("diff") for r in records if "diff" in r]
        if diffs and processes.is_main:  # one writer: diffs of several processes never interleave
            write_stdout("".join(diffs))
        for resume in states:
            resume.clear()
    if args.stats and processes.is_main:
        if many:
            for record in records:
                print(json.dumps(record), file=sys.stderr)
            print(json.dumps(_merge(records)), file=sys.stderr)
        else:
            print(json.dumps(job.stats.as_dict()), file=sys.stderr)
    if args.command == "rewrite" and processes.is_main:
        _say_when_nothing_was_rewritten(args, records)
    return EXIT_GUARDED if any(r["guarded_chunks"] for r in records) else 0


def _is_terminal() -> bool:
    return sys.stdout.isatty()


def _say_when_nothing_was_rewritten(args, records: list[dict]) -> None:
    """One line when every chunk was kept as it was: the likely cause and the fix."""
    chunks, kept = sum(r["chunks"] for r in records), sum(r["guarded_chunks"] for r in records)
    if chunks and kept == chunks:
        model = "the default model (SmolLM2-135M-Instruct)" if args.model == "default" else f"model {args.model}"
        print(f"ngramspec rewrite: no chunk was rewritten (all {chunks} kept as they were): {model} is likely too "
              "small for this instruction; a larger instruct model usually manages, e.g. --model "
              f"{LARGER_MODEL}", file=sys.stderr)


def _merge(records: list[dict]) -> dict:
    """Totals over documents (what --stats prints last with several inputs)."""
    tokens = sum(r["new_tokens"] for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    return {"documents": len(records), "processes": len({r["process"] for r in records}),
            "chunks": sum(r["chunks"] for r in records), "resumed_chunks": sum(r["resumed_chunks"] for r in records),
            "speed_chunks": sum(r["speed_chunks"] for r in records), "new_tokens": tokens, "target_forwards": forwards,
            "mat": round(tokens / forwards, 3) if forwards else None, "seconds_summed": round(seconds, 3),
            "similarity_min": min((r["similarity_min"] for r in records if r["similarity_min"] is not None),
                                  default=None),
            "guarded_chunks": sum(r["guarded_chunks"] for r in records)}


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled as Ctrl-C is: the locks released, finished chunks kept."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def _stop_signals():
    """SIGTERM and SIGHUP raise :class:`Interrupted` during the block (main thread only: main()
    also runs in-process, in tests), then the handlers are as they were."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGTERM, signal.SIGHUP]
    before = {s: signal.signal(s, _interrupt) for s in signals}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with _stop_signals():
            return run(args)
    except CliError as err:
        print(f"ngramspec {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except WriteError as err:
        print(f"ngramspec {args.command}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except DegenerateError as err:
        print(f"ngramspec {args.command}: error: {err}", file=sys.stderr)
        return EXIT_DEGENERATE
    except KeyboardInterrupt as err:
        import signal

        signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
        what = ("the input is untouched and no output was written" if len(args.inputs) == 1 else
                "documents finished so far are written; the others are untouched")
        print(f"\nngramspec {args.command}: interrupted ({signal.Signals(signum).name}); {what}. "
              "Finished chunks are saved: rerun the same command with --resume to continue.", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())

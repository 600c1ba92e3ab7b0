"""`ngramspec rewrite|summarize`: fix, restyle, simplify or summarize a document, fast.

    ngramspec rewrite notes.md --instruction "Fix grammar and spelling." -o fixed.md
    ngramspec rewrite app.py --instruction "Add type hints." --in-place      # keeps app.py.bak
    cat report.txt | ngramspec summarize - --stats

Long documents are split along natural boundaries (Markdown sections, top-level code blocks,
paragraphs), each chunk is rewritten with the instruction, and the results are joined with the
document's own blank lines and indentation. Output streams to the terminal as it is accepted;
a progress bar (chunks, tokens/s, mean accepted tokens per forward) goes to stderr.

Many documents at once, into a folder (or --in-place), sharded over processes or GPUs:

    ngramspec rewrite docs/*.md --instruction "Fix typos." --out-dir fixed/
    accelerate launch --multi_gpu --num_processes 2 -m ngramspec rewrite docs/*.md ... --out-dir fixed/

Under `accelerate launch` each process takes a share of the documents (balanced by size) and
the first process prints the merged summary (on a machine without CUDA the processes run on
CPU, each with cores / processes torch threads).

Safety: the input is never overwritten unless --in-place, which writes atomically and keeps a
.bak copy. Output files are written atomically at the end, so an interrupted run leaves the
input untouched and no half-written output; finished chunks are saved as they complete, and
--resume continues from them (with many documents, finished documents are skipped). An output
that is a symlink keeps being one (its target is replaced); a device, FIFO or /dev/stdout is
written through. A run locks its output files (.NAME.lock beside each): a second run on the same
output stops at once (exit 2). A failed write (disk full) exits 1 and leaves the old file whole.

Trust: a small model sometimes answers with something else than the text (a chat reply,
invented code, one line repeated until the token limit). Each chunk's generation stops once
it repeats a span many times over where the input does not, or runs past the length bound;
a rewritten chunk that drifted (similarity below --keep-drifted, longer than --max-growth,
Markdown headings/lists/fences/front matter or Python syntax broken) is kept as it was, with a
line on stderr even under --quiet. A summary that loops is refused: nothing is written.

Exit status: 0 done; 1 a write failed; 2 bad usage; 3 done, but some chunks were kept as they
were (the output is written; stderr names them); 4 a summary degenerated (nothing written);
130 interrupted.

Fidelity: the model sees LF line breaks and no byte-order mark; the output gets the input's
back (CRLF, BOM), and a rewrite keeps the input's trailing newline, or its absence.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from .documents import SUMMARIZE_INSTRUCTION
from .jobs import start_processes
from .process import CliError, DegenerateError, WriteError, lock_output, output_path, process_share, write_stdout
from .settings import JobSettings

EXIT_FAILED, EXIT_USAGE, EXIT_GUARDED, EXIT_DEGENERATE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
# The JobSettings fields set by an option (their defaults are the option's): field -> (flag, dest).
JOB_OPTIONS = {"chunk_tokens": ("--chunk-tokens", "chunk_tokens"),
               "similarity_floor": ("--keep-drifted", "keep_drifted"), "max_growth": ("--max-growth", "max_growth")}


def _config_options(parser: argparse.ArgumentParser) -> None:
    """One --option per speculator setting (a sub-config's ``cost_tuning.window`` as
    --cost-tuning-window), defaults read from the dataclasses."""
    from ..draft.config import SpeculatorConfig, setting_fields

    group = parser.add_argument_group("speculator settings (defaults from SpeculatorConfig)")
    tuning = parser.add_argument_group("speculator tuning (rarely changed; SpeculatorConfig's sub-configs)")
    described = SpeculatorConfig.describe()
    for name, (_, f) in setting_fields().items():
        flag, where = "--" + name.replace("_", "-").replace(".", "-"), tuning if "." in name else group
        if isinstance(f.default, bool):
            where.add_argument(flag, dest=name, default=f.default, action=argparse.BooleanOptionalAction,
                               help=described[name])
        else:
            # verify_cost's default None is "auto" (argparse passes a text default through type)
            default, text = f.default, described[name]
            if name == "verify_cost":
                default = "auto"
                text += " Or a fixed curve, q:cost pairs relative to one token: 1:1.0,8:1.5,24:2.0."
            where.add_argument(flag, dest=name, default=default, type=_setting_parser(name),
                               metavar=f.name.upper(), help=text)
    group.add_argument("--no-speculation", action="store_true",
                       help="plain decoding, for comparison (same output when greedy, just slower)")


def _setting_parser(name: str):
    """argparse ``type`` for a SpeculatorConfig field: the settings parser's reader, its message."""
    from ..draft.config import read_setting

    def parse(text: str):
        try:
            return read_setting(name, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    defaults = JobSettings()
    parser = argparse.ArgumentParser(prog="ngramspec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{rewrite,summarize}")
    for name, help_text, more in (("rewrite", "rewrite a document following an instruction", ""),
                                  ("summarize", "summarize a document",
                                   " A summary is meant to differ from its text: it has no drift guard "
                                   "(rewrite's --keep-drifted) and no --diff; a summary that repeats itself "
                                   "is refused (exit 4, nothing written).")):
        p = sub.add_parser(name, help=help_text, description=help_text + "." + more,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        p.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="text, Markdown or code file(s); '-' reads stdin (one input only)")
        p.add_argument("--instruction", required=(name == "rewrite"),
                       default=None if name == "rewrite" else SUMMARIZE_INSTRUCTION,
                       help="what to do with the text")
        p.add_argument("-o", "--output", default=None, help="output file (default: stdout; one input only)")
        p.add_argument("--out-dir", default=None,
                       help="folder for the outputs, one per input under the input's file name (created if missing)")
        if name == "rewrite":
            p.add_argument("--in-place", action="store_true",
                           help="replace INPUT with the result (atomically; the original is kept as INPUT.bak)")
            p.add_argument("--diff", action="store_true",
                           help="print a unified diff of each INPUT against its rewrite to stdout and write "
                                "nothing (both headers name INPUT, so `patch -p0 < DIFF` applies it)")
            p.add_argument("--keep-drifted", type=float, default=defaults.similarity_floor, metavar="BELOW",
                           help="drift guard: keep a chunk as it was when its rewrite's similarity to it "
                                "(0-1, as --stats reports it) is below BELOW, when it is longer than "
                                "--max-growth, or when it broke the chunk's structure; a line on stderr per "
                                "kept chunk and exit status 3. 0 turns the guard off")
            p.add_argument("--max-growth", type=float, default=defaults.max_growth, metavar="RATIO",
                           help="drift guard: longest rewrite kept, as a multiple of its chunk's length (a "
                                "chunk also stops generating there); raise it for instructions that add text")
        p.add_argument("--model", default="default",
                       help="'default' (SmolLM2-135M-Instruct), a local model folder or a hub id")
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help=f"tokens generated per chunk (default: rewrite --max-growth x the chunk + "
                            f"{defaults.length_slack}, {defaults.unguarded_growth}x with the guard off; "
                            f"summarize {defaults.summary_tokens})")
        p.add_argument("--chunk-tokens", type=int, default=defaults.chunk_tokens,
                       help=f"largest chunk, in tokens (at least {defaults.min_chunk_tokens})")
        p.add_argument("--kind", choices=("auto", "text", "markdown", "code"), default="auto",
                       help="how to find chunk boundaries (auto: from the file suffix)")
        p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
        p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --sample)")
        p.add_argument("--seed", type=int, default=None, help="random seed (with --sample)")
        p.add_argument("--resume", action="store_true", help="continue an interrupted run from its finished chunks")
        p.add_argument("--quiet", action="store_true",
                       help="no streaming and no progress bars (nor transformers' while the model loads)")
        p.add_argument("--stats", action="store_true",
                       help="print a final JSON line of stats to stderr: chunks, guarded chunks, time; tokens, "
                            "forwards, MAT, tokens/s and speed-up estimate over the chunks whose rewrite was used; "
                            "minimum and mean similarity of rewritten chunks to their source")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
        _config_options(p)
    return parser


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
    if args.output is not None and inputs[0] != "-" and Path(args.output).resolve() == Path(inputs[0]).resolve():
        raise CliError("the output would overwrite the input; pass --in-place to replace it (a .bak is kept)")
    if args.output is not None and not Path(args.output).resolve().parent.is_dir():
        raise CliError(f"{args.output}: its folder does not exist")
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
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be at least 1")
    if args.temperature <= 0:
        raise CliError("--temperature must be > 0")


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
    """The SpeculatorConfig of the --min-n ... options (bad values are usage errors)."""
    from ..draft.config import SpeculatorConfig, config_with, setting_fields

    settings = {name: getattr(args, name) for name in setting_fields() if hasattr(args, name)}
    try:
        return config_with(SpeculatorConfig(), settings)
    except (TypeError, ValueError) as err:
        raise CliError(f"speculator setting: {err}") from None


def _document_job(args, config, device: str | None, stream: bool):
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
    if stream:
        from transformers import TextStreamer

        streamer_factory = lambda: TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)  # noqa: E731
    return DocumentJob(model, tokenizer, None if args.no_speculation else NgramSpeculator(config),
                       max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                       seed=args.seed, streamer_factory=streamer_factory, settings=job_settings(args))


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
    # needs no process group (and is the only case that streams to the terminal).
    many = len(args.inputs) > 1 or args.out_dir is not None or int(os.environ.get("WORLD_SIZE", "1")) > 1
    processes = start_processes(args.threads, distributed=many)
    mine = shard_by_size([len(t) for t in raws], processes.world)[processes.rank]
    stream = (not many and not args.quiet and not getattr(args, "diff", False) and sys.stdout.isatty()
              and output_path(args, args.inputs[0]) is None)
    with contextlib.ExitStack() as locks:  # this process's outputs, before the model loads
        for i in mine:
            lock_output(args, args.inputs[i], locks)
        job = _document_job(args, config, processes.device, stream)
        records, states = process_share(args, job, raws, mine, config, processes, stream)
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
    return EXIT_GUARDED if any(r["guarded_chunks"] for r in records) else 0


def _merge(records: list[dict]) -> dict:
    """Totals over documents (what --stats prints last with several inputs)."""
    tokens = sum(r["new_tokens"] for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    return {"documents": len(records), "processes": len({r["process"] for r in records}),
            "chunks": sum(r["chunks"] for r in records), "new_tokens": tokens, "target_forwards": forwards,
            "mat": round(tokens / forwards, 3) if forwards else 0.0, "seconds_summed": round(seconds, 3),
            "similarity_min": min((r["similarity_min"] for r in records if r["similarity_min"] is not None),
                                  default=None),
            "guarded_chunks": sum(r["guarded_chunks"] for r in records)}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
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
    except KeyboardInterrupt:
        what = ("the input is untouched and no output was written" if len(args.inputs) == 1 else
                "documents finished so far are written; the others are untouched")
        print(f"\nngramspec {args.command}: interrupted; {what}. "
              "Finished chunks are saved: rerun the same command with --resume to continue.", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())

"""`ngramspec rewrite|summarize`: fix, restyle, simplify or summarize a document, fast.

    ngramspec rewrite notes.md --instruction "Fix grammar and spelling." -o fixed.md
    ngramspec rewrite app.py --instruction "Add type hints." --in-place      # keeps app.py.bak
    cat report.txt | ngramspec summarize - --stats

Long documents are split along natural boundaries (Markdown sections, top-level code blocks,
paragraphs), each chunk is rewritten with the instruction, and the results are joined with the
document's own blank lines and indentation. Output streams to the terminal as it is accepted;
a progress bar (chunks, tokens/s, mean accepted tokens per forward) goes to stderr.

Safety: the input is never overwritten unless --in-place, which writes atomically and keeps a
.bak copy. Output files are written atomically at the end, so an interrupted run leaves the
input untouched and no half-written output; finished chunks are saved as they complete, and
--resume continues from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


class CliError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback."""


def _config_options(parser: argparse.ArgumentParser) -> None:
    """One --option per simple SpeculatorConfig field, defaults read from the dataclass."""
    from .config import SpeculatorConfig

    group = parser.add_argument_group("speculator settings (defaults from SpeculatorConfig)")
    for f in dataclasses.fields(SpeculatorConfig):
        if f.type in ("tuple",) or isinstance(f.default, tuple):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            group.add_argument(flag, dest=f.name, default=f.default, action=argparse.BooleanOptionalAction,
                               help=f"(default: {f.default})")
        else:
            group.add_argument(flag, dest=f.name, default=f.default, type=type(f.default), metavar=f.name.upper(),
                               help=f"(default: {f.default})")
    group.add_argument("--no-speculation", action="store_true",
                       help="plain decoding, for comparison (same output when greedy, just slower)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ngramspec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{rewrite,summarize}")
    for name, help_text in (("rewrite", "rewrite a document following an instruction"),
                            ("summarize", "summarize a document")):
        p = sub.add_parser(name, help=help_text, description=help_text + ".",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        p.add_argument("input", help="text, Markdown or code file; '-' reads stdin")
        p.add_argument("--instruction", required=(name == "rewrite"),
                       default=None if name == "rewrite" else "Summarize the following text in a few sentences.",
                       help="what to do with the text")
        p.add_argument("-o", "--output", default=None, help="output file (default: stdout)")
        if name == "rewrite":
            p.add_argument("--in-place", action="store_true",
                           help="replace INPUT with the result (atomically; the original is kept as INPUT.bak)")
        p.add_argument("--model", default="default",
                       help="'default' (SmolLM2-135M-Instruct), a local model folder or a hub id")
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help="tokens generated per chunk (default: rewrite 2x the chunk + 64, summarize 256)")
        p.add_argument("--chunk-tokens", type=int, default=768, help="largest chunk, in tokens")
        p.add_argument("--kind", choices=("auto", "text", "markdown", "code"), default="auto",
                       help="how to find chunk boundaries (auto: from the file suffix)")
        p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
        p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --sample)")
        p.add_argument("--seed", type=int, default=None, help="random seed (with --sample)")
        p.add_argument("--resume", action="store_true", help="continue an interrupted run from its finished chunks")
        p.add_argument("--quiet", action="store_true", help="no streaming and no progress bar")
        p.add_argument("--stats", action="store_true",
                       help="print a final JSON line of stats to stderr (time, tokens, forwards, MAT, speed-up estimate)")
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


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and a rename: all or nothing."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        if path.exists():
            shutil.copymode(path, temp)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class ResumeState:
    """Finished chunks of one (input, command, instruction, model, settings) run, on disk."""

    def __init__(self, key_parts: dict):
        from .models import cache_dir

        key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:24]
        self.path = cache_dir() / "resume" / f"{key}.json"
        self.done: dict[int, str] = {}

    def load(self) -> dict[int, str]:
        if self.path.is_file():
            try:
                self.done = {int(k): v for k, v in json.loads(self.path.read_text(encoding="utf-8")).items()}
            except (ValueError, OSError):
                self.done = {}
        return self.done

    def save(self, index: int, text: str) -> None:
        self.done[index] = text
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.done))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def _check_args(args) -> None:
    if args.instruction is not None and not args.instruction.strip():
        raise CliError("the instruction is empty; say what to do, e.g. --instruction \"Fix the grammar.\"")
    if getattr(args, "in_place", False):
        if args.input == "-":
            raise CliError("--in-place needs a file, not stdin")
        if args.output is not None:
            raise CliError("give either --in-place or -o/--output, not both")
    if args.output is not None and args.input != "-" and Path(args.output).resolve() == Path(args.input).resolve():
        raise CliError("the output would overwrite the input; pass --in-place to replace it (a .bak is kept)")
    if args.output is not None and not Path(args.output).resolve().parent.is_dir():
        raise CliError(f"{args.output}: its folder does not exist")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be at least 1")
    if args.chunk_tokens < 32:
        raise CliError("--chunk-tokens must be at least 32")
    if args.temperature <= 0:
        raise CliError("--temperature must be > 0")


def run(args) -> int:
    _check_args(args)
    text = read_input(args.input)
    from .config import SpeculatorConfig

    settings = {f.name: getattr(args, f.name) for f in dataclasses.fields(SpeculatorConfig) if hasattr(args, f.name)}
    try:
        config = SpeculatorConfig(**settings)
    except (TypeError, ValueError) as err:
        raise CliError(f"speculator setting: {err}") from None

    import torch

    from .chunking import kind_of
    from .documents import DocumentJob
    from .models import ModelNotFoundError, load_model
    from .speculator import NgramSpeculator

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_model(args.model)
    except (ModelNotFoundError, OSError, ValueError) as err:
        raise CliError(f"cannot load model {args.model!r}: {str(err).splitlines()[0]}") from None

    to_terminal = args.output is None and not getattr(args, "in_place", False)
    stream = not args.quiet and sys.stdout.isatty()
    streamer_factory = None
    if stream:
        from transformers import TextStreamer

        streamer_factory = lambda: TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)  # noqa: E731
    job = DocumentJob(model, tokenizer, None if args.no_speculation else NgramSpeculator(config),
                      max_new_tokens=args.max_new_tokens, chunk_tokens=args.chunk_tokens, sample=args.sample,
                      temperature=args.temperature, seed=args.seed, streamer_factory=streamer_factory)
    kind = kind_of(None if args.input == "-" else args.input, text) if args.kind == "auto" else args.kind
    state = ResumeState({"input": hashlib.sha256(text.encode()).hexdigest(), "command": args.command,
                         "instruction": args.instruction, "model": args.model, "config": repr(config),
                         "sample": args.sample, "temperature": args.temperature, "seed": args.seed,
                         "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens, "kind": kind})
    done = state.load() if args.resume else {}
    if not args.resume:
        state.clear()

    from tqdm import tqdm

    chunks = job.chunks(text, kind)
    total = len(chunks) if args.command == "rewrite" else sum(1 for c in chunks if c.body)
    bar = tqdm(total=total, unit="chunk", file=sys.stderr, disable=args.quiet, desc=args.command, initial=0)

    def on_chunk(index, chunk, body):
        if index not in done:
            state.save(index, body)
        if stream and to_terminal and args.command == "rewrite":
            sys.stdout.write(chunk.trail)  # the blank lines between chunks
            sys.stdout.flush()
        bar.update(1)
        stats = job.stats
        if stats.seconds:
            bar.set_postfix(tok_s=f"{stats.new_tokens / stats.seconds:.1f}", mat=f"{stats.mat:.2f}")

    try:
        if args.command == "rewrite":
            result = job.rewrite(text, args.instruction, kind, done=done, on_chunk=on_chunk)
        else:
            result = job.summarize(text, args.instruction, kind, done=done, on_chunk=on_chunk)
    finally:
        bar.close()

    if getattr(args, "in_place", False):
        backup = Path(args.input + ".bak")
        write_atomic(backup, text)
        write_atomic(Path(args.input), result)
    elif args.output is not None:
        write_atomic(Path(args.output), result)
    elif not stream:
        sys.stdout.write(result)
        sys.stdout.flush()
    else:
        sys.stdout.write("\n" if not result.endswith("\n") else "")
    state.clear()
    if args.stats:
        print(json.dumps(job.stats.as_dict()), file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CliError as err:
        print(f"ngramspec {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"\nngramspec {args.command}: interrupted; the input is untouched and no output was written. "
              "Finished chunks are saved: rerun the same command with --resume to continue.", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())

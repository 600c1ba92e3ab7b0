"""The `ngramspec rewrite|summarize` options: the common path in --help, every option (the
speculation settings too) in --help-all, and each speculation setting read by the settings
parser, whether it comes from --config FILE, --set NAME=VALUE or its own option.
"""

from __future__ import annotations

import argparse

from .settings import SUMMARIZE_INSTRUCTION, JobSettings

# The JobSettings fields set by an option (their defaults are the option's): field -> (flag, dest).
JOB_OPTIONS = {"chunk_tokens": ("--chunk-tokens", "chunk_tokens"),
               "similarity_floor": ("--keep-drifted", "keep_drifted"), "max_growth": ("--max-growth", "max_growth")}


COMMON = ("-o", "--instruction", "--model", "--resume", "--restart", "--diff", "--keep-drifted", "--max-growth")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown once: never "(default: None)" or "(default: False)", and not where the
    help text already states its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, []) or "default" in text:
            return text
        return super()._get_help_string(action)


class _HelpAll(argparse.Action):
    """--help-all: the command's help with every option, the speculation settings included."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        build_parser(full=True).parse_args([parser.prog.split()[-1], "--help"])


def _config_options(parser: argparse.ArgumentParser, full: bool) -> None:
    """--set, --config, --no-speculation, and one --option per speculator setting (a
    sub-config's ``cost_tuning.window`` as --cost-tuning-window), defaults read from the
    dataclasses; all of them listed by --help-all only."""
    from ..draft.config import SpeculatorConfig, setting_fields

    shown = (lambda text: text) if full else (lambda text: argparse.SUPPRESS)
    group = parser.add_argument_group("speculation settings (any of them also as --set NAME=VALUE; defaults from "
                                      "SpeculatorConfig)")
    group.add_argument("--set", dest="set_settings", action="append", default=[], metavar="NAME=VALUE",
                       help="a speculation setting, e.g. --set max_draft_tokens=16 --set cost_tuning.window=20 "
                            "(repeatable; read by the settings parser, like the options below)"
                       if full else argparse.SUPPRESS)
    group.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                       help=shown("a file of NAME=VALUE settings, one a line or comma-separated (# comments); "
                                  "--set and the options below override it"))
    group.add_argument("--no-speculation", action="store_true",
                       help=shown("plain decoding, for comparison (same output when greedy, just slower)"))
    tuning = parser.add_argument_group("speculation tuning (rarely changed; SpeculatorConfig's sub-configs)")
    described = SpeculatorConfig.describe()
    for name, (_, f) in setting_fields().items():
        flag, where = "--" + name.replace("_", "-").replace(".", "-"), tuning if "." in name else group
        # None: not given, so --config and --set are not overridden by a default
        if isinstance(f.default, bool):
            where.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction,
                               help=shown(described[name] + f" (default: {f.default})"))
        else:
            text = described[name] + f" (default: {'off' if f.default is None else f.default})"
            if name == "verify_cost":  # its default None is "auto"
                text = described[name] + " Or a fixed curve, q:cost pairs relative to one token: " \
                    "1:1.0,8:1.5,24:2.0 (default: auto)"
            where.add_argument(flag, dest=name, default=None, type=_setting_parser(name),
                               metavar=f.name.upper(), help=shown(text))


def _setting_parser(name: str):
    """argparse ``type`` for a SpeculatorConfig field: the settings parser's reader, its message."""
    from ..draft.config import read_setting

    def parse(text: str):
        try:
            return read_setting(name, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def build_parser(full: bool = False, description: str = "") -> argparse.ArgumentParser:
    """The command's parser. Its --help lists the common path (COMMON); ``full`` (--help-all)
    lists every option: a hidden one works the same, it is only left out of --help."""
    defaults = JobSettings()
    parser = argparse.ArgumentParser(prog="ngramspec", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{rewrite,summarize}")
    for name, help_text, more in (("rewrite", "rewrite a document following an instruction", ""),
                                  ("summarize", "summarize a document",
                                   " A summary is meant to differ from its text: it has no drift guard "
                                   "(rewrite's --keep-drifted) and no --diff; a summary that repeats itself "
                                   "is refused (exit 4, nothing written) unless --accept-loops.")):
        p = sub.add_parser(name, help=help_text, formatter_class=_HelpFormatter,
                           description=help_text + "." + more + ("" if full else
                                                                 " More options (--out-dir, --in-place, --stats, "
                                                                 "--quiet, --stream-raw, sampling, --set NAME=VALUE "
                                                                 "for the speculation settings): --help-all."))
        more_help = (lambda text: text) if full else (lambda text: argparse.SUPPRESS)
        p.add_argument("--help-all", action=_HelpAll, help="list every option, the speculation settings too")
        p.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="text, Markdown or code file(s); '-' reads stdin (one input only)")
        p.add_argument("--instruction", required=(name == "rewrite"),
                       default=None if name == "rewrite" else SUMMARIZE_INSTRUCTION,
                       help="what to do with the text")
        p.add_argument("-o", "--output", default=None, help="output file (default: stdout; one input only)")
        p.add_argument("--model", default="default",
                       help="'default' (SmolLM2-135M-Instruct: fast, but on real documents it rarely manages a "
                            "rewrite the guard keeps), a local model folder or a hub id, e.g. "
                            "Qwen/Qwen2.5-1.5B-Instruct")
        p.add_argument("--resume", action="store_true", help="continue an interrupted run from its finished chunks")
        p.add_argument("--restart", action="store_true",
                       help="discard the finished chunks an interrupted run saved, and start over")
        if name == "rewrite":
            p.add_argument("--diff", action="store_true",
                           help="print a unified diff of each INPUT against its rewrite and write nothing "
                                "(`patch -p0 < DIFF` applies it)")
            p.add_argument("--keep-drifted", type=float, default=defaults.similarity_floor, metavar="BELOW",
                           help="drift guard: keep a chunk as it was when its rewrite's similarity to it (0-1) is "
                                f"below BELOW, it grew past --max-growth, or its structure broke (exit status 3); "
                                f"0 turns the guard off (default: by the instruction, {defaults.correction_floor} "
                                f"for corrections of typos, spelling, grammar or punctuation, "
                                f"{defaults.rewording_floor} for any other, which asks for rewording)")
            p.add_argument("--max-growth", type=float, default=defaults.max_growth, metavar="RATIO",
                           help="drift guard: longest rewrite kept, as a multiple of its chunk's length; raise it "
                                "for instructions that add text")
            p.add_argument("--in-place", action="store_true",
                           help=more_help("replace INPUT with the result (atomically; the original is kept as "
                                          "INPUT.bak)"))
        else:
            p.add_argument("--accept-loops", action="store_true",
                           help="write a summary that repeated itself (cut where it was stopped) instead of "
                                "refusing it")
        p.add_argument("--out-dir", default=None,
                       help=more_help("folder for the outputs, one per input under the input's file name "
                                      "(created if missing)"))
        p.add_argument("--stream-raw", action="store_true",
                       help=more_help("print the model's raw output to stdout as it is generated, text the guard "
                                      "may then discard (by default stdout shows each chunk's final text once "
                                      "the guard has decided)"))
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help=more_help(f"tokens generated per chunk (default: rewrite --max-growth x the chunk + "
                                      f"{defaults.length_slack}, {defaults.unguarded_growth}x with the guard off; "
                                      f"summarize {defaults.summary_tokens})"))
        p.add_argument("--chunk-tokens", type=int, default=defaults.chunk_tokens,
                       help=more_help(f"largest chunk, in tokens (at least {defaults.min_chunk_tokens})"))
        p.add_argument("--kind", choices=("auto", "text", "markdown", "code"), default="auto",
                       help=more_help("how to find chunk boundaries (auto: from the file suffix)"))
        p.add_argument("--sample", action="store_true", help=more_help("sample instead of greedy decoding"))
        p.add_argument("--temperature", type=float, default=1.0, help=more_help("sampling temperature (with --sample)"))
        p.add_argument("--seed", type=int, default=None, help=more_help("random seed (with --sample)"))
        p.add_argument("--quiet", action="store_true",
                       help=more_help("no progress bar and no per-chunk lines but those of kept chunks (nor "
                                      "transformers' bars while the model loads)"))
        p.add_argument("--stats", action="store_true",
                       help=more_help("print a final JSON line of stats to stderr: chunks (resumed and kept ones "
                                      "counted), similarity of the written text to the input; speed (tokens, "
                                      "forwards, MAT, tokens/s, speed-up estimate) over the chunks whose output "
                                      "was written and not stopped as a loop"))
        p.add_argument("--threads", type=int, default=None,
                       help=more_help("torch CPU threads (default: torch's choice)"))
        _config_options(p, full)
    return parser


class OptionError(ValueError):
    """A bad --config file or --set value (the command reports it as a usage error)."""


def speculator_config(args):
    """The SpeculatorConfig of --config FILE, then --set NAME=VALUE, then the settings' own
    options (each later one overrides), all read by the settings parser."""
    from ..draft.config import SpeculatorConfig, config_with, parse_config, setting_fields

    try:
        config = SpeculatorConfig()
        if getattr(args, "config_file", None):
            try:
                lines = open(args.config_file, encoding="utf-8").read().splitlines()
            except OSError as err:
                raise OptionError(f"--config {args.config_file}: {err.strerror or err}") from None
            config = parse_config(",".join(line.split("#", 1)[0] for line in lines), config)
        for text in getattr(args, "set_settings", None) or []:
            if "=" not in text:
                raise OptionError(f"--set takes NAME=VALUE, got {text!r}")
            config = parse_config(text, config)
        given = {name: getattr(args, name) for name in setting_fields() if getattr(args, name, None) is not None}
        return config_with(config, given)
    except (TypeError, ValueError) as err:
        raise OptionError(f"speculator setting: {err}") from None

"""README.md against the code: what it quotes (settings, defaults, command-line flags, methods,
files and modules) must exist and agree with the code, so the README cannot go stale silently.

- The settings table (`| setting | default | meaning |`, one SpeculatorConfig field per row) lists
  every field, in the dataclass's order, with the dataclass's default.
- A default quoted in prose ("default `name=value`", "`--flag` (default X)") equals the code's.
- Every `name=value` setting quoted is a real knob with a value its parser takes; every method
  (`ngramspec:max_n=4`, `--methods a,b`) parses with the harness's method parser.
- Every `--flag` of an `ngramspec` or `python -m eval COMMAND` command line exists in that
  command's parser; a flag quoted alone exists in one of the project's parsers or is another
  tool's, named in OTHER_TOOLS_FLAGS.
- Every backticked path exists, every backticked snake_case name occurs in the code, and the
  Layout section lists exactly the package's modules, folder by folder.
"""

import argparse
import ast
import dataclasses
import importlib
import re
import shlex
from pathlib import Path

import pytest

from eval.__main__ import COMMANDS
from eval.__main__ import build_parser as eval_parser
from eval.methods import KINDS, parse_method, parse_methods
from ngramspec.app.cli import build_parser as cli_parser
from ngramspec.draft import config as config_module
from ngramspec.draft.config import SpeculatorConfig, parse_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIELDS = {f.name: f.default for f in dataclasses.fields(SpeculatorConfig)}
PACKAGE_FOLDERS = ("util", "cost", "draft", "hf", "vllm", "app")

# Flags of other tools the README quotes outside a command line (pip, vLLM, accelerate, pytest).
OTHER_TOOLS_FLAGS = {
    "--no-deps": "pip",
    "--tensor-parallel-size": "vllm serve", "--pipeline-parallel-size": "vllm serve",
    "--data-parallel-size": "vllm serve", "--speculative-config": "vllm serve",
    "--dtype": "vllm serve", "--enforce-eager": "vllm serve",
    "--multi_gpu": "accelerate launch", "--num_processes": "accelerate launch",
}
# Keyword arguments of transformers' generate() that the README names beside the speculator's.
GENERATE_KEYWORDS = {"ngram_speculator", "custom_generate", "attention_mask", "streamer", "stopping_criteria",
                     "prefix_allowed_tokens_fn", "logits_processor", "assistant_model", "inputs_embeds"}


def transformers_names() -> set[str]:
    """generate()'s arguments (GenerationConfig's attributes and GENERATE_KEYWORDS), and the
    from_pretrained() keywords that select how a model computes."""
    from transformers import GenerationConfig

    return set(vars(GenerationConfig())) | GENERATE_KEYWORDS | {"attn_implementation", "dtype"}


def readme() -> str:
    return README.read_text(encoding="utf-8")


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^ *```[a-z]*\n(.*?)^ *```", text, flags=re.S | re.M)


def inline_spans(text: str) -> list[str]:
    """`...` spans outside fenced blocks."""
    prose = re.sub(r"^ *```[a-z]*\n.*?^ *```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


def section(text: str, heading: str) -> str:
    """The text under a heading (any level) up to the next heading of the same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.M)
    assert match, f"README has no heading {heading!r}"
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[match.end():], flags=re.M)
    return text[match.end(): match.end() + end.start() if end else len(text)]


def command_lines(text: str) -> list[str]:
    """Shell lines of the fenced blocks (continuations joined, comments dropped) and inline spans
    that are commands."""
    lines = []
    for block in fenced_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(line.split(" #")[0].strip())
    return lines + inline_spans(text)


def parser_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


CLI = {name: parser_options(p) for name, p in subparsers(cli_parser()).items()}
EVAL = {name: parser_options(subparsers(eval_parser(name))[name]) for name in COMMANDS}


def literal(text: str):
    """The value a README quote names: a Python literal, or ``Name()``, a sub-config class built
    at its own defaults (so the config's default is compared with a fresh instance, not with
    itself)."""
    if re.fullmatch(r"[A-Z]\w*\(\)", text):  # a sub-config at its defaults, such as CostModelTuning()
        declared = getattr(config_module, text[:-2], None)
        assert dataclasses.is_dataclass(declared), f"README names {text}: no such sub-config class in draft/config"
        return declared()
    return None if text == "None" else ast.literal_eval(text)


def nested_default(name: str):
    """The code's default of a dotted sub-config setting, ``cost_tuning.window``."""
    group, _, field = name.partition(".")
    assert group in FIELDS and dataclasses.is_dataclass(FIELDS[group]), f"{name}: {group!r} is no sub-config field"
    assert field in {f.name for f in dataclasses.fields(FIELDS[group])}, f"{name}: no such setting of {group}"
    return getattr(FIELDS[group], field)


# -- the settings --------------------------------------------------------------------------------


def settings_table(text: str) -> list[tuple[str, str]]:
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", section(text, "Settings"), flags=re.M)
    assert rows, "the Settings section has no `| `name` | `default` | meaning |` rows"
    return rows


def test_settings_table_lists_every_field_with_its_default():
    rows = settings_table(readme())
    assert [name for name, _ in rows] == list(FIELDS), "the table must list SpeculatorConfig's fields, in order"
    for name, default in rows:
        assert literal(default) == FIELDS[name], f"README says {name} defaults to {default}, the code {FIELDS[name]!r}"


def test_settings_table_quotes_the_nested_defaults():
    """A sub-config's row quotes some of its settings as `group.name=value`: each is that
    setting's default (and a setting of that group)."""
    quoted = re.findall(r"^\| `(\w+)` \| `\w+\(\)` \|(.*)$", section(readme(), "Settings"), flags=re.M)
    assert quoted, "no sub-config row (`| `name` | `Class()` | ... |`) in the Settings table"
    checked = 0
    for group, meaning in quoted:
        for name, value in re.findall(r"`(\w+\.\w+)=([^`]+)`", meaning):
            assert name.startswith(group + "."), f"the {group} row quotes {name}"
            assert literal(value) == nested_default(name), f"README: {name}={value}; code: {nested_default(name)!r}"
            checked += 1
    assert checked, "no `group.name=value` default quoted in the sub-config rows"


def test_defaults_quoted_in_prose_are_the_code_defaults():
    text = readme()
    quoted = [(m.group(1), m.group(2))
              for m in re.finditer(r"(?<!previous )defaults? \(?`(\w+(?:\.\w+)?)=([^`]+)`", text)]
    assert quoted, "no `default name=value` quote found: the pattern no longer matches the README"
    for name, value in quoted:
        assert name in FIELDS or "." in name, f"README quotes a default for {name!r}: no SpeculatorConfig field"
        code = nested_default(name) if "." in name else FIELDS[name]  # a sub-config's setting: cost_tuning.window
        assert literal(value) == code, f"README: default {name}={value}; code: {code!r}"
    flags = re.findall(r"`(--[\w-]+)` \((?:default:? )?([\d.]+)[;,)]", text)
    assert flags, "no `--flag` (default X) quote found: the pattern no longer matches the README"
    for flag, value in flags:
        defaults = {a.default for options in CLI.values() for s, a in options.items() if s == flag}
        assert defaults, f"README quotes a default for {flag}, which the ngramspec command lacks"
        assert float(value) in defaults, f"README: {flag} defaults to {value}; the parser: {defaults}"


def test_quoted_settings_are_real_knobs_with_valid_values():
    """`name=value[,name=value...]` spans naming a SpeculatorConfig field (alone, in
    NGRAMSPEC_SETTINGS or after a method) parse; other `name=value` names are transformers'."""
    checked = 0
    for span in inline_spans(readme()):
        span = re.sub(r"^NGRAMSPEC_SETTINGS=\"(.*)\"$", r"\1", span)
        match = re.fullmatch(r"([a-z]\w*(?:\.\w+)?)=(\S+)", span)
        if not match or "..." in span:
            continue
        name = match.group(1)
        if name in FIELDS or name.partition(".")[0] in FIELDS:  # a field, or a sub-config's: cost_tuning.window
            value = match.group(2)
            if value != "None" and not value.startswith("(("):
                parse_config(span)  # unknown names and bad values raise
            checked += 1
        else:
            method_settings = {n for known in KINDS.values() if known for n in known}
            assert name in transformers_names() | method_settings, (
                f"README quotes `{span}`: {name!r} is no SpeculatorConfig field, method setting or generate() "
                "argument")
    assert checked, "no quoted setting found"


def test_quoted_methods_parse():
    text = readme()
    methods = [m for line in command_lines(text) for m in re.findall(r"--methods[ =](\S+)", line)]
    assert methods
    for listed in methods:
        parse_methods(listed)
    kinds = r"(?:ngramspec(?:\+\w+)*|ngram|suffix|oracle|truth-sized)"
    for span in inline_spans(text):
        if re.fullmatch(rf"{kinds}:\S*=\S*", span) and "..." not in span:
            parse_method(span)


# -- command lines -------------------------------------------------------------------------------


def flags_after(line: str, marker: str) -> list[str]:
    rest = line.split(marker, 1)[1]
    try:
        words = shlex.split(rest)
    except ValueError:
        words = rest.split()
    return [w.split("=")[0] for w in words if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", w)]


def test_command_line_flags_exist_in_their_parsers():
    seen = 0
    for line in command_lines(readme()):
        cli = re.search(r"(?:^|\s|-m )ngramspec (rewrite|summarize)\b", line)
        ev = re.search(r"-m eval ([a-z][\w-]*)", line)
        if cli:
            options, where = CLI[cli.group(1)], f"ngramspec {cli.group(1)}"
            flags = flags_after(line, cli.group(0))
        elif ev:
            assert ev.group(1) in COMMANDS, f"python -m eval has no command {ev.group(1)!r}: {line}"
            options, where = EVAL[ev.group(1)], f"python -m eval {ev.group(1)}"
            flags = flags_after(line, ev.group(0))
        else:
            continue
        for flag in flags:
            assert flag in options, f"{where} has no {flag} (README: {line})"
            seen += 1
    assert seen > 20, "too few command-line flags found: the README's commands are no longer recognised"


def test_flags_quoted_alone_exist():
    known = {s for options in [*CLI.values(), *EVAL.values()] for s in options}
    import fuzz

    fuzz_flags = re.findall(r'add_argument\("(--[\w-]+)"', Path(fuzz.__file__).read_text())
    known |= set(fuzz_flags) | set(OTHER_TOOLS_FLAGS)
    for span in inline_spans(readme()):
        match = re.fullmatch(r"(--[A-Za-z][\w-]*)(?:[ =].*)?", span)
        if match:
            assert match.group(1) in known, f"README quotes `{span}`: no parser of the project has {match.group(1)}"


# -- names and files -----------------------------------------------------------------------------


def code_words() -> set[str]:
    words = set()
    for folder in ("ngramspec", "eval", "tasks", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "test_readme.py":
                words |= set(re.findall(r"\w+", path.read_text(encoding="utf-8")))
    return words


def test_quoted_names_and_paths_exist():
    words = code_words()
    outputs = (ROOT / "eval" / "gpu_check.sh").read_text()  # where the GPU check writes
    for span in set(inline_spans(readme())):
        path = re.fullmatch(r"((?:ngramspec|eval|tasks|tests|examples)/[\w/.-]*?)(?:::\w+)?/?", span)
        if path:
            assert (ROOT / path.group(1)).exists() or path.group(1) in outputs, (
                f"README quotes `{span}`: no such file or folder, nor an output the code names")
            continue
        if re.search(r"\s", span) or re.search(r"\.(py|md|json|jsonl|sh|txt)$", span):
            continue  # a formula or a command line; a file name (checked above when in the project)
        for name in re.findall(r"(?<![\w.-])([a-z]\w*_\w+)\b", span):
            assert name in words or name in transformers_names(), (
                f"README quotes `{span}`: {name!r} occurs nowhere in the code")
        dotted = re.fullmatch(r"(ngramspec(?:\.\w+)+)", span)
        if dotted:
            module, _, attr = dotted.group(1).rpartition(".")
            try:
                importlib.import_module(dotted.group(1))
            except ImportError:
                assert hasattr(importlib.import_module(module), attr), f"README quotes `{span}`: no such name"


@pytest.mark.parametrize("folder", PACKAGE_FOLDERS)
def test_layout_lists_the_package_modules(folder):
    block = fenced_blocks(section(readme(), "Layout"))[0]
    entry = re.search(rf"^  {folder}/ +(.*?)(?=^  \w+/|^\S)", block, flags=re.S | re.M)
    assert entry, f"Layout has no ngramspec/{folder}/ entry"
    listed = set(re.findall(r"(?<![\w/])(\w+)\.py\b", entry.group(1)))  # not tests/x.py
    real = {p.stem for p in (ROOT / "ngramspec" / folder).glob("*.py") if p.name != "__init__.py"}
    assert listed == real, f"ngramspec/{folder}/: Layout lists {sorted(listed - real)} that do not exist " \
                           f"and misses {sorted(real - listed)}"


def test_real_model_test_size_is_the_tests():
    """"its N items x M new tokens" where the README describes tests/test_real_model.py."""
    import test_real_model

    quoted = re.findall(r"real-model test \(`tests/test_real_model.py`\).*?(\d+) items x (\d+) new tokens",
                        readme(), flags=re.S)
    assert quoted, "README no longer says how many items and tokens the real-model test decodes"
    for items, tokens in quoted:
        assert (int(items), int(tokens)) == (sum(test_real_model.ITEMS.values()), test_real_model.MAX_NEW_TOKENS)


def test_the_supported_models_section_is_the_committed_tables():
    """README's Supported models list is generated from eval/results/compat (never edited by hand)."""
    from eval.compat_report import BEGIN, END, load_rows, readme_section

    text = readme()
    assert text[text.index(BEGIN): text.index(END) + len(END)] == readme_section(load_rows())

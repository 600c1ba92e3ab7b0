"""HumanEvalFix (HumanEvalPack): whole buggy function -> whole fixed function, 164 problems in
each of six languages.

See ../shared/data/humanevalfix/PROVENANCE.md. The file holds the languages one after another
(all Python, then all JavaScript, ...), so ``load`` interleaves them: item k of every language
before item k+1 of any, languages in ``LANGUAGES`` order. A ``limit`` therefore samples every
language evenly: ``limit=12`` gives Python-0, JavaScript-0, Java-0, Go-0, CPP-0, Rust-0,
Python-1, ..., Rust-1. ``languages=`` keeps only the named languages, in the order given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, zip_longest

from .base import Hub, Task, take

LANGUAGES = ("python", "js", "java", "go", "cpp", "rust")  # file order; also the hub configs


def interleave(items: Iterable[dict], languages: Sequence[str] = LANGUAGES) -> list[dict]:
    """Round-robin over ``languages``, file order within each language."""
    unknown = sorted(set(languages) - set(LANGUAGES))
    if unknown:
        raise ValueError(f"unknown language(s) {unknown}; known: {', '.join(LANGUAGES)}")
    groups = {language: [] for language in languages}
    for item in items:
        if item["language"] in groups:
            groups[item["language"]].append(item)
    rounds = zip_longest(*groups.values())
    return [item for item in chain.from_iterable(rounds) if item is not None]


@dataclass(frozen=True)
class HumanEvalFixTask(Task):
    def load(
        self,
        data_dir: str | os.PathLike | None = None,
        limit: int | None = None,
        languages: Sequence[str] = LANGUAGES,
    ) -> list[dict]:
        """The first ``limit`` items of the language-interleaved order (see the module docstring)."""
        return take(interleave(self.items(data_dir), languages), limit)


TASK = HumanEvalFixTask(
    name="humanevalfix",
    family="code_editing",
    file="humanevalfix/humanevalfix.jsonl",
    hub=Hub(
        id="bigcode/humanevalpack",
        configs=LANGUAGES,
        config_field="language",
        split="test",
        source=("declaration", "buggy_solution"),
        references=("declaration", "canonical_solution"),
        instruction="Fix bugs in {entry_point}.",
        note="one config per language, split test: declaration + buggy_solution -> source, "
        "declaration + canonical_solution -> the one reference (same 984 items)",
    ),
)

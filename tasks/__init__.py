"""The ten shared evaluation sets (one module each) and the helpers the harness uses.

Every item holds at least ``id, task, source, instruction, references`` (see
../shared/data/README.md). The prompt is the model's chat template applied to
``instruction + "\\n\\n" + source`` with the generation prompt added (the recipe the shared
greedy traces were recorded with). Sets are read in place from the data directory (``--data-dir``/
``data_dir=``, else ``$NGRAMSPEC_DATA``, else ``../shared/data`` next to the repository), never
copied. ``load_items`` returns the first ``limit`` items in file order, except humanevalfix,
which interleaves its six languages (see ``tasks.humanevalfix``).
"""

from __future__ import annotations

import os

from . import asset, cnndm, dialogsum, editeval, humanevalfix, iterater, jfleg, qmsum, quixbugs, xsum
from .base import Hub, Task, default_data_dir, messages
from .scoring import METRICS

__all__ = [
    "FAMILIES", "FILES", "METRICS", "TASKS", "Hub", "Task",
    "default_data_dir", "family_of", "load_items", "messages", "prompt_ids",
]

# Family by family, so "all sets" runs summarization, then rewriting, then code editing.
TASKS: dict[str, Task] = {
    module.TASK.name: module.TASK
    for module in (cnndm, xsum, dialogsum, qmsum, jfleg, asset, iterater, humanevalfix, quixbugs, editeval)
}
FAMILIES: dict[str, tuple[str, ...]] = {
    family: tuple(name for name, task in TASKS.items() if task.family == family) for family in METRICS
}
# set name -> JSONL path relative to the data directory
FILES: dict[str, str] = {name: task.file for name, task in TASKS.items()}


def _task(name: str) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown set {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]


def family_of(name: str) -> str:
    return _task(name).family


def load_items(name: str, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """The first ``limit`` items of set ``name``, each a dict of the schema (see ``Task.load``)."""
    return _task(name).load(data_dir, limit)


def prompt_ids(tokenizer, item: dict) -> list[int]:
    """Chat-template token ids for one item (instruction, blank line, source)."""
    encoded = tokenizer.apply_chat_template(messages(item), add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])

"""One evaluation set: where its file is, how an item becomes a prompt, how an output is scored.

Items come from the shared JSONL files (one schema; see ../shared/data/README.md), read in place
through ``datasets.load_dataset("json", ...)``: plain dicts in file order. Sets whose lines carry
different extra fields (iterater_human: document vs sentence revisions) get datasets' union
schema, so a field a line lacks is present as ``None``.

The data directory comes from ``data_dir=``/``--data-dir``, else ``$NGRAMSPEC_DATA``, else
``../shared/data`` next to the repository. Only when a set's file is missing and
``NGRAMSPEC_USE_HUB=1`` is set, the set's upstream hub dataset is loaded instead (see ``Hub``).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import scoring

DATA_ENV = "NGRAMSPEC_DATA"
USE_HUB_ENV = "NGRAMSPEC_USE_HUB"


def default_data_dir() -> Path:
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def messages(item: dict) -> list[dict]:
    """The chat for one item: a single user turn, instruction + blank line + source.

    The shared greedy traces were recorded with exactly this recipe; changing it changes every
    prompt and invalidates them.
    """
    return [{"role": "user", "content": item["instruction"] + "\n\n" + item["source"]}]


@dataclass(frozen=True)
class Hub:
    """A set's upstream dataset on the Hugging Face Hub and how its columns map onto the schema.

    The hub copy is not always the same items as the shared file (``note`` says how it differs),
    so numbers from it are not comparable with numbers from the shared data.
    """

    id: str
    split: str
    source: tuple[str, ...]  # columns concatenated into ``source``
    references: tuple[str, ...]  # one list column, or columns concatenated into one reference
    instruction: str  # str.format template over the row, e.g. "Fix bugs in {entry_point}."
    configs: tuple[str | None, ...] = (None,)
    config_field: str | None = None  # item field recording the config (humanevalfix: "language")
    note: str = ""

    def to_item(self, row: dict, name: str, config: str | None, index: int) -> dict:
        """One hub row in the shared schema; the upstream columns stay as extra fields."""
        item = dict(row)
        item.update(
            id=f"{name}-{config}-{index}" if config else f"{name}-{index}",
            task=name,
            source="".join(row[column] for column in self.source),
            instruction=self.instruction.format(**row),
            references=self._references(row),
        )
        if self.config_field:
            item[self.config_field] = config
        return item

    def _references(self, row: dict) -> list[str]:
        if len(self.references) == 1 and isinstance(row[self.references[0]], list):
            return list(row[self.references[0]])
        return ["".join(row[column] for column in self.references)]


def _datasets():
    """The ``datasets`` package, or an ImportError naming the extra that installs it."""
    from ngramspec.util.extras import require

    return require("datasets", "eval")


@cache
def _read_jsonl(path: str, mtime_ns: int) -> tuple[dict, ...]:
    """All items of one file, parsed once per process (the mtime key drops a stale copy)."""
    datasets = _datasets()
    return tuple(datasets.load_dataset("json", data_files=path, split="train").to_list())


@cache
def _read_hub(hub: Hub, name: str) -> tuple[dict, ...]:
    """All items of a set's hub dataset (every config, in order), downloaded once per process."""
    datasets = _datasets()

    items = []
    for config in hub.configs:
        rows = datasets.load_dataset(hub.id, config, split=hub.split)
        items.extend(hub.to_item(row, name, config, index) for index, row in enumerate(rows))
    return tuple(items)


@dataclass(frozen=True)
class Task:
    """An evaluation set: ``name``, its ``family`` (summarization, rewriting, code_editing), its
    ``file`` relative to the data directory, and its upstream ``hub`` dataset (None if there is
    no public copy of these items)."""

    name: str
    family: str
    file: str
    hub: Hub | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        """The score names ``score`` can return (it leaves out those an item cannot support)."""
        return scoring.METRICS[self.family]

    def path(self, data_dir: str | os.PathLike | None = None) -> Path:
        return Path(data_dir or default_data_dir()) / self.file

    def load(self, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
        """The first ``limit`` items (all if None) in file order, as fresh dicts the caller may change."""
        return take(self.items(data_dir), limit)

    def items(self, data_dir: str | os.PathLike | None = None) -> tuple[dict, ...]:
        """Every item, shared with the in-process cache: read-only (``load`` returns copies)."""
        path = self.path(data_dir)
        if path.is_file():
            return _read_jsonl(str(path.resolve()), path.stat().st_mtime_ns)
        if self.hub is not None and os.environ.get(USE_HUB_ENV) == "1":
            return _read_hub(self.hub, self.name)
        hint = f", or set {USE_HUB_ENV}=1 to load {self.hub.id} from the Hugging Face Hub" if self.hub else ""
        raise FileNotFoundError(
            f"{path} not found: pass the shared data directory with --data-dir or {DATA_ENV}{hint}."
        )

    def messages(self, item: dict) -> list[dict]:
        return messages(item)

    def score(self, output: str, item: dict) -> dict[str, float]:
        """Quality scores of a decoded ``output`` for ``item`` (see ``tasks.scoring``)."""
        return scoring.score(self.family, output, item)


def take(items, limit: int | None) -> list[dict]:
    """Deep copies of the first ``limit`` items, so callers cannot corrupt the shared cache."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return copy.deepcopy(list(items[:limit]))

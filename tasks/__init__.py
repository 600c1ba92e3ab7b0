"""Evaluation items from the shared data sets (one JSONL schema; see ../shared/data/README.md).

Every line holds at least ``id, task, source, instruction, references``. The prompt is the
model's chat template applied to ``instruction + "\\n\\n" + source`` with the generation
prompt added (the recipe the shared greedy traces were recorded with).

The data directory comes from ``--data-dir``/``data_dir=``, else ``$NGRAMSPEC_DATA``, else
``../shared/data`` next to the repository. Sets are read in place, never copied.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FAMILIES = {
    "summarization": ("spec_bench_cnndm", "xsum", "dialogsum", "qmsum_specific"),
    "rewriting": ("jfleg", "asset", "iterater_human"),
    "code_editing": ("humanevalfix", "quixbugs", "editeval_instructcoder"),
}
# set name -> JSONL path relative to the data directory
FILES = {
    "spec_bench_cnndm": "spec_bench/spec_bench_cnndm_summarization.jsonl",
    "xsum": "xsum/xsum.jsonl",
    "dialogsum": "dialogsum/dialogsum.jsonl",
    "qmsum_specific": "qmsum_specific/qmsum_specific.jsonl",
    "jfleg": "jfleg/jfleg.jsonl",
    "asset": "asset/asset.jsonl",
    "iterater_human": "iterater_human/iterater_human.jsonl",
    "humanevalfix": "humanevalfix/humanevalfix.jsonl",
    "quixbugs": "quixbugs/quixbugs.jsonl",
    "editeval_instructcoder": "editeval_instructcoder/editeval_instructcoder.jsonl",
}


def default_data_dir() -> Path:
    if os.environ.get("NGRAMSPEC_DATA"):
        return Path(os.environ["NGRAMSPEC_DATA"])
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def family_of(name: str) -> str:
    for family, names in FAMILIES.items():
        if name in names:
            return family
    raise KeyError(f"unknown set {name!r}; known: {sorted(FILES)}")


def load_items(name: str, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """The first ``limit`` items of set ``name`` (in file order), each a dict of the schema."""
    if name not in FILES:
        raise KeyError(f"unknown set {name!r}; known: {sorted(FILES)}")
    path = Path(data_dir or default_data_dir()) / FILES[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: pass the shared data directory with --data-dir or NGRAMSPEC_DATA."
        )
    items = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                items.append(json.loads(line))
                if limit is not None and len(items) >= limit:
                    break
    return items


def prompt_ids(tokenizer, item: dict) -> list[int]:
    """Chat-template token ids for one item (instruction, blank line, source)."""
    messages = [{"role": "user", "content": item["instruction"] + "\n\n" + item["source"]}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])

"""ASSET test: sentence simplification, ten references.

See ../shared/data/asset/PROVENANCE.md.
"""

from .base import Hub, Task

TASK = Task(
    name="asset",
    family="rewriting",
    file="asset/asset.jsonl",
    hub=Hub(
        id="facebook/asset",
        configs=("simplification",),
        split="test",
        source=("original",),
        references=("simplifications",),
        instruction="Simplify this sentence while keeping its meaning:",
        note="config simplification, split test: original -> source, simplifications -> "
        "references (same 359 items)",
    ),
)

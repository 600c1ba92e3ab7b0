"""JFLEG test: fluency-oriented grammatical error correction, four references.

See ../shared/data/jfleg/PROVENANCE.md.
"""

from .base import Hub, Task

TASK = Task(
    name="jfleg",
    family="rewriting",
    file="jfleg/jfleg.jsonl",
    hub=Hub(
        id="jhu-clsp/jfleg",
        split="test",
        source=("sentence",),
        references=("corrections",),
        instruction="Fix the grammatical errors in this text while keeping it fluent:",
        note="split test: sentence -> source, corrections -> references (same 747 items)",
    ),
)

"""IteraTeR-HUMAN test: 51 document revisions, then 364 sentence revisions (intent-specific
instructions).

See ../shared/data/iterater_human/PROVENANCE.md. Document and sentence lines carry different
extra fields; loaded together, each item has all of them, None where a line lacks one.
The hub fallback covers the document-level part only.
"""

from .base import Hub, Task

TASK = Task(
    name="iterater_human",
    family="rewriting",
    file="iterater_human/iterater_human.jsonl",
    hub=Hub(
        id="wanyu/IteraTeR_human_doc",
        split="test",
        source=("before_revision",),
        references=("after_revision",),
        instruction="Revise this text to improve it:",
        note="split test: before_revision -> source, after_revision -> the one reference; "
        "document-level items only (the sentence-level set is wanyu/IteraTeR_human_sent)",
    ),
)

"""DialogSum test: 500 dialogues, three human summaries each.

See ../shared/data/dialogsum/PROVENANCE.md.
"""

from .base import Hub, Task

TASK = Task(
    name="dialogsum",
    family="summarization",
    file="dialogsum/dialogsum.jsonl",
    hub=Hub(
        id="knkarthick/dialogsum",
        split="test",
        source=("dialogue",),
        references=("summary",),
        instruction="Summarize the dialogue.",
        note="split test: dialogue -> source, summary -> one reference per row (the hub copy "
        "may hold one row per summary rather than three references per dialogue)",
    ),
)

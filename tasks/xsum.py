"""XSum: BBC articles with a one-sentence gold summary (HELM's 1,000-article sample).

See ../shared/data/xsum/PROVENANCE.md. The hub has the whole XSum test split, not HELM's sample.
"""

from .base import Hub, Task

TASK = Task(
    name="xsum",
    family="summarization",
    file="xsum/xsum.jsonl",
    hub=Hub(
        id="EdinburghNLP/xsum",
        split="test",
        source=("document",),
        references=("summary",),
        instruction="Summarize the above article in 1 sentence.",
        note="split test: document -> source, summary -> the one reference; the full test split, "
        "not HELM's 1,000-article sample",
    ),
)

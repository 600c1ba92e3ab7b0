"""Spec-Bench's 80 CNN/DailyMail items: long news articles, highlights as the reference.

See ../shared/data/spec_bench/PROVENANCE.md. The hub has the whole CNN/DM test split
(11,490 articles), not Spec-Bench's 80, so hub items differ from the shared ones.
"""

from .base import Hub, Task

TASK = Task(
    name="spec_bench_cnndm",
    family="summarization",
    file="spec_bench/spec_bench_cnndm_summarization.jsonl",
    hub=Hub(
        id="abisee/cnn_dailymail",
        configs=("3.0.0",),
        split="test",
        source=("article",),
        references=("highlights",),
        instruction="Summarize:",
        note="config 3.0.0, split test: article -> source, highlights -> the one reference; "
        "the full test split, not Spec-Bench's 80-item sample",
    ),
)

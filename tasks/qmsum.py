"""QMSum test, specific queries answered from the gold transcript spans only.

See ../shared/data/qmsum_specific/PROVENANCE.md. No hub dataset holds this gold-span setting
(hub copies such as SCROLLS' give the whole meeting), so there is no hub fallback.
"""

from .base import Task

TASK = Task(name="qmsum_specific", family="summarization", file="qmsum_specific/qmsum_specific.jsonl")

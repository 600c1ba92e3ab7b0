"""QuixBugs: whole buggy program -> whole corrected program, 40 Python then 40 Java, one-line
defects.

See ../shared/data/quixbugs/PROVENANCE.md. The hub copy has the Python programs only.
"""

from .base import Hub, Task

TASK = Task(
    name="quixbugs",
    family="code_editing",
    file="quixbugs/quixbugs.jsonl",
    hub=Hub(
        id="Muennighoff/quixbugs",
        split="train",
        source=("buggy_program",),
        references=("solution",),
        instruction="Fix the bug in this program. It is a one-line defect.",
        note="split train: buggy_program -> source, solution -> the one reference; Python only",
    ),
)

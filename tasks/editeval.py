"""EditEval (InstructCoder's test set): an instruction plus Python code -> the edited code.

See ../shared/data/editeval_instructcoder/PROVENANCE.md. EditEval ships as a file in the
CodeInstruct repository (edit_eval/edit_eval.jsonl), not as a hub dataset (the hub's
InstructCoder is the training data), so there is no hub fallback.
"""

from .base import Task

TASK = Task(
    name="editeval_instructcoder",
    family="code_editing",
    file="editeval_instructcoder/editeval_instructcoder.jsonl",
)

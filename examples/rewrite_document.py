"""Rewrite a whole document with the library API: chunked, structure-preserving, speculative.

    python examples/rewrite_document.py README.md "Fix grammar and spelling." > fixed.md

With no arguments it rewrites a short built-in sample. (The `ngramspec rewrite` command does
the same with streaming, a progress bar, --in-place, --resume and friendly errors.)
"""

import sys

import ngramspec
from ngramspec.app.chunking import kind_of
from ngramspec.app.documents import DocumentJob

SAMPLE = """# Meeting notes

The team have decided to moved the release to next week. Their is still two bugs open.

## Action items

- Fix the login bug befor Friday.
- Update the the documentation.
"""

path = sys.argv[1] if len(sys.argv) > 1 else None
instruction = sys.argv[2] if len(sys.argv) > 2 else "Fix the grammar and spelling. Keep the Markdown formatting."
text = open(path, encoding="utf-8").read() if path else SAMPLE

model, tokenizer = ngramspec.load_model()
job = DocumentJob(model, tokenizer, ngramspec.NgramSpeculator())
print(job.rewrite(text, instruction, kind=kind_of(path, text)), end="")
print(job.stats.as_dict(), file=sys.stderr)  # chunks, tokens, forwards, MAT, tok/s

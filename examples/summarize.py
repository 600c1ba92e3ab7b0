"""Summarize a document (each chunk, then the chunk summaries) with the speculator.

    python examples/summarize.py article.txt
"""

import sys

import ngramspec
from ngramspec.app.documents import DocumentJob

SAMPLE = (
    "The city council met on Tuesday to discuss the new bicycle lanes. Supporters said the lanes "
    "would make streets safer and reduce traffic. Shop owners worried that removing parking would "
    "hurt their business. After two hours of debate, the council voted to build the lanes on two "
    "streets first and to review the results after one year."
)

text = open(sys.argv[1], encoding="utf-8").read() if len(sys.argv) > 1 else SAMPLE
model, tokenizer = ngramspec.load_model()
job = DocumentJob(model, tokenizer, ngramspec.NgramSpeculator(), max_new_tokens=160)
print(job.summarize(text), end="")
print(job.stats.as_dict(), file=sys.stderr)

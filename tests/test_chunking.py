"""Chunking: lossless splits along the coarsest natural boundary that fits, and joins that keep
the document's own whitespace."""

import pytest

from ngramspec.app.chunking import Chunk, join_chunks, kind_of, split_document

DOCUMENT = """# Notes on the release

This paragraph explains the release. It has a few sentences, and some of them
wrap over two lines.

## Code

```python
def add(a, b):
    return a + b
```

    An indented block stays indented.

- a list item
- another list item


Final paragraph after two blank lines.
"""


def test_chunks_are_lossless_and_respect_boundaries():
    count = lambda text: len(text.split())  # noqa: E731  a word "tokenizer"
    for budget in (3, 8, 20, 1000):
        chunks = split_document(DOCUMENT, budget, count, "markdown")
        assert "".join(c.lead + c.body + c.trail for c in chunks) == DOCUMENT
        assert join_chunks(chunks, [c.body for c in chunks]) == DOCUMENT
        fence = [c.body for c in chunks if "def add" in c.body]
        if budget >= 20:  # the fenced block (9 words) fits: it is never cut
            assert fence[0].count("```") == 2  # opening and closing fence in one chunk
    sections = split_document(DOCUMENT, 30, count, "markdown")
    assert any(c.body.startswith("## Code") for c in sections)  # a heading starts a chunk
    code = "import os\n\n\ndef f():\n    x = 1\n\n    return x\n\n\nclass A:\n    pass\n"
    pieces = split_document(code, 8, count, "code")
    assert [c.body.split()[0] for c in pieces] == ["import", "def", "class"]  # top-level blocks
    assert kind_of("a.md", "") == "markdown" and kind_of("a.py", "") == "code" and kind_of(None, "# T\n") == "markdown"


def test_bad_kind_and_mismatched_bodies_are_rejected():
    with pytest.raises(ValueError, match="kind must be one of"):
        split_document("text", 10, len, "html")
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        split_document("text", 0, len)
    with pytest.raises(ValueError, match="2 chunks but 1 bodies"):
        join_chunks([Chunk("", "a", "\n"), Chunk("", "b", "")], ["x"])


def test_a_single_line_over_budget_is_cut_at_sentences():
    count = lambda text: len(text.split())  # noqa: E731  a word "tokenizer"
    line = "One two three. Four five six. Seven eight nine."
    chunks = split_document(line, 4, count)
    assert [c.body for c in chunks] == ["One two three.", "Four five six.", "Seven eight nine."]
    assert "".join(c.lead + c.body + c.trail for c in chunks) == line

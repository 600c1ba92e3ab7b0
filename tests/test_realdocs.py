"""The real-document suite (eval/realdocs.py): its typos and scoring, and the guard's targets on
documents of this machine with the default model."""

import ast
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # eval/ lives at the repo root

from eval.realdocs import excerpt, find_documents, inject_typos, run_document, score_typos  # noqa: E402

CODE = '''"""A modul docstring with words to misspell."""

import os


def walk(path):
    # Return every filename under the directory, recursively.
    return [name for _, _, names in os.walk(path) for name in names]
'''


def test_typos_go_into_comments_and_docstrings_only_and_code_still_parses():
    typoed, typos = inject_typos(CODE, "code", seed=3)
    assert typos and typoed != CODE
    ast.parse(typoed)
    for typo in typos:
        assert typoed[typo["start"] : typo["start"] + len(typo["typo"])] == typo["typo"]
        assert typo["typo"] != typo["word"] and sorted(typo["typo"]) == sorted(typo["word"])
    def code_lines(text):
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("#", '"'))]

    assert code_lines(typoed) == code_lines(CODE)
    assert inject_typos(CODE, "code", seed=3) == (typoed, typos)  # a fixed seed, the same typos


def test_score_counts_fixed_typos_and_new_differences():
    clean = "The careful reviewer checked every sentence twice, then went to lunch.\n"
    typoed, typos = inject_typos(clean, "text", seed=1)
    assert len(typos) == 2
    assert score_typos(clean, typoed, clean, typos) == {"typos": 2, "fixed": 2, "new_differences": 0}
    assert score_typos(clean, typoed, typoed, typos) == {"typos": 2, "fixed": 0, "new_differences": 0}
    reworded = clean.replace("twice", "again").replace("lunch", "dinner")
    assert score_typos(clean, typoed, reworded, typos) == {"typos": 2, "fixed": 2, "new_differences": 2}


def test_excerpts_end_at_a_paragraph_and_code_excerpts_parse():
    text = "First paragraph.\n\nSecond one is here.\n\nThird."
    assert excerpt(text, "text", 30) == "First paragraph.\n"
    assert excerpt(CODE, "code", 60).startswith('"""A modul') and ast.parse(excerpt(CODE, "code", 60))


@pytest.mark.real_model
def test_real_documents_come_back_no_worse_than_they_went_in():
    """Two documents of this machine (a doc and a standard-library module), default model and
    settings: every chunk either keeps its structure, parse status and length, or is kept."""
    from ngramspec import NgramSpeculator, load_model
    from ngramspec.app.documents import DocumentJob

    docs = find_documents(seed=0, chars=1200, groups={"docs": 1, "stdlib": 1})
    if len(docs) < 2:
        pytest.skip("this machine has no /usr/share/doc documents to try")
    model, tokenizer = load_model()
    job = DocumentJob(model, tokenizer, NgramSpeculator())
    for i, doc in enumerate(docs):
        row = run_document(job, None, doc, seed=i)
        assert row["length_ratio"] <= 1.3, row
        if doc["kind"] == "code":
            assert row["parses"] == [True, True], row
        assert row["guarded"] <= row["chunks"]

"""Output quality scores, kept cheap and dependency-light (rapidfuzz only).

They are sanity checks that a decoding method did not change what the model says, and rough
task-quality numbers for the report; they are not the official metric of any benchmark (no
stemming in ROUGE, no test execution for code).

Per family (``score``):

- summarization: ``{"rougeL"}``, the best ROUGE-L F1 over the references;
- rewriting: ``{"ref_similarity", "src_similarity"}``, the best character similarity to a
  reference, and the similarity to the source (how much of the input the output copies);
- code_editing: ``{"exact_match", "edit_similarity"}``, the fenced code of the output (else
  the whole output) against the best reference, ignoring trailing whitespace per line and
  leading/trailing blank lines.

A score that needs references is left out when an item has none, so an average over items
never mixes in zeros that only mean "no reference".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rapidfuzz import fuzz
from rapidfuzz.distance import LCSseq, Levenshtein

METRICS = {
    "summarization": ("rougeL",),
    "rewriting": ("ref_similarity", "src_similarity"),
    "code_editing": ("exact_match", "edit_similarity"),
}

_WORD = re.compile(r"\w+")
# An opening fence (with an optional language tag), then everything up to the closing fence or,
# for an output cut off by the token budget, up to the end of the text.
_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _words(text: str) -> list[str]:
    """Lowercased word tokens (letters, digits, underscore); punctuation is dropped."""
    return _WORD.findall(text.lower())


def _as_list(references: str | Sequence[str]) -> list[str]:
    """Accept one reference as a plain string rather than iterating over its characters."""
    return [references] if isinstance(references, str) else list(references)


def rouge_l(prediction: str, references: str | Sequence[str]) -> float:
    """Word-level ROUGE-L F1 (LCS-based, lowercased), the maximum over the references.

    0.0 when the prediction or every reference has no words, or when there are no references.
    """
    predicted = _words(prediction)
    best = 0.0
    for reference in _as_list(references):
        words = _words(reference)
        common = LCSseq.similarity(predicted, words) if predicted and words else 0
        if common:
            precision, recall = common / len(predicted), common / len(words)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def similarity(a: str, b: str) -> float:
    """Character-level similarity in [0, 1] (rapidfuzz's Indel ratio); 1.0 for identical text."""
    return fuzz.ratio(a, b) / 100.0


def edit_similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / length of the longer text, in [0, 1]."""
    return Levenshtein.normalized_similarity(a, b)


def extract_code(text: str) -> str:
    """The contents of the first fenced (```) block, else the text itself.

    An unclosed fence (a generation cut off mid-block) yields everything after it.
    """
    match = _FENCE.search(text)
    return match.group(1) if match else text


def _normalize_code(text: str) -> str:
    """Drop trailing whitespace per line and leading/trailing blank lines: layout noise a chat
    model adds around code that says nothing about the edit itself."""
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def exact_match(a: str, b: str) -> float:
    """1.0 when the two texts agree up to trailing whitespace per line and surrounding blank lines."""
    return float(_normalize_code(a) == _normalize_code(b))


def score_summarization(output: str, item: dict) -> dict[str, float]:
    references = item["references"]
    return {"rougeL": rouge_l(output, references)} if references else {}


def score_rewriting(output: str, item: dict) -> dict[str, float]:
    text = output.strip()
    scores = {}
    if item["references"]:
        scores["ref_similarity"] = max(similarity(text, ref) for ref in item["references"])
    scores["src_similarity"] = similarity(text, item["source"])
    return scores


def score_code_editing(output: str, item: dict) -> dict[str, float]:
    references = [_normalize_code(ref) for ref in item["references"]]
    if not references:
        return {}
    code = _normalize_code(extract_code(output))
    return {
        "exact_match": max(exact_match(code, ref) for ref in references),
        "edit_similarity": max(edit_similarity(code, ref) for ref in references),
    }


_SCORERS = {
    "summarization": score_summarization,
    "rewriting": score_rewriting,
    "code_editing": score_code_editing,
}


def score(family: str, output: str, item: dict) -> dict[str, float]:
    """The family's scores for one decoded output (a subset of ``METRICS[family]``)."""
    return _SCORERS[family](output, item)

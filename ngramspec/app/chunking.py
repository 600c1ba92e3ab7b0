"""Split a document into chunks along natural boundaries, and join rewritten chunks back.

    pieces = split_document(text, max_tokens=768, count_tokens=len_in_tokens, kind="markdown")
    text == "".join(p.lead + p.body + p.trail for p in pieces)      # lossless
    join_chunks(pieces, rewritten_bodies)                            # same blank lines, fences

A chunk's ``body`` is what gets rewritten; its ``lead``/``trail`` (blank lines and other
whitespace around it) are copied through untouched, so the document's structure survives.
Boundaries, from coarsest to finest: Markdown sections (a heading line) or top-level code
blocks (a non-indented line after a blank line), then paragraphs (blank lines), then lines,
and only for a single line longer than the budget, sentences or, failing that, characters.
Consecutive blocks are packed into one chunk while they fit the budget, and a fenced code block
(```...```) is never cut unless it alone exceeds the budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("text", "markdown", "code")
_CODE_SUFFIXES = {
    ".py", ".js", ".ts", ".java", ".c", ".h", ".cc", ".cpp", ".hpp", ".go", ".rs", ".rb", ".php", ".cs",
    ".swift", ".kt", ".scala", ".sh", ".lua", ".r", ".jl", ".m", ".sql", ".toml", ".yaml", ".yml", ".json",
}


@dataclass(frozen=True)
class Chunk:
    lead: str  # whitespace before the body, copied through
    body: str  # the text to rewrite (no leading/trailing whitespace)
    trail: str  # whitespace after the body, copied through


def kind_of(path: str | None, text: str) -> str:
    """'markdown', 'code' or 'text', from the file suffix (stdin: a heading line means Markdown)."""
    suffix = ("." + path.rsplit(".", 1)[-1].lower()) if path and "." in path.rsplit("/", 1)[-1] else ""
    if suffix in (".md", ".markdown", ".rst"):
        return "markdown"
    if suffix in _CODE_SUFFIXES:
        return "code"
    if not suffix and re.search(r"^#{1,6} \S", text, flags=re.MULTILINE):
        return "markdown"
    return "text"


def _lines_grouped(text: str, starts_group) -> list[str]:
    """Split ``text`` into groups of lines, a new group where ``starts_group(line,
    previous_blank)`` says so (never inside a ``` or ~~~ fence); concatenation is ``text``."""
    groups, current, in_fence, previous_blank = [], [], False, True
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if not in_fence and starts_group(line, previous_blank) and any(part.strip() for part in current):
            groups.append("".join(current))
            current = []
        current.append(line)
        if stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence = not in_fence
        previous_blank = stripped == ""
    if current:
        groups.append("".join(current))
    return groups


def _sections(text: str, kind: str) -> list[str]:
    """Markdown: one section per heading; other kinds: the whole text."""
    if kind != "markdown":
        return [text]
    return _lines_grouped(text, lambda line, _: bool(re.match(r"#{1,6} \S", line)))


def _blocks(text: str, kind: str) -> list[str]:
    """Paragraphs (text, markdown; fenced blocks whole) or top-level blocks (code: a
    non-indented line after a blank line starts one)."""
    if kind == "code":
        return _lines_grouped(text, lambda line, blank: blank and line.strip() != "" and not line[:1].isspace())
    return _lines_grouped(text, lambda line, blank: blank and line.strip() != "")


def _split_long(block: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    """A block over budget -> lines, then sentences, then characters, packed to the budget."""
    if count(block) <= max_tokens:
        return [block]
    units = block.splitlines(keepends=True)
    if len(units) == 1:
        units = re.split(r"(?<=[.!?;])(?=\s)", block)
        if len(units) == 1:  # one huge token-dense line: cut by characters
            step = max(1, len(block) * max_tokens // max(count(block), 1))
            units = [block[i : i + step] for i in range(0, len(block), step)]
    out: list[str] = []
    for unit in units:
        pieces = _split_long(unit, max_tokens, count) if count(unit) > max_tokens and unit != block else [unit]
        for piece in pieces:
            if out and count(out[-1] + piece) <= max_tokens:
                out[-1] += piece
            else:
                out.append(piece)
    return out


def split_document(text: str, max_tokens: int, count_tokens: Callable[[str], int], kind: str = "text") -> list[Chunk]:
    """Chunks of at most ``max_tokens`` tokens each (by ``count_tokens``), split at the
    coarsest natural boundary that fits, whose lead + body + trail concatenate to ``text``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    packed: list[str] = []

    def add(piece: str, may_join: bool) -> None:
        if may_join and packed and count_tokens(packed[-1] + piece) <= max_tokens:
            packed[-1] += piece
        else:
            packed.append(piece)

    # Whole sections join a chunk when they fit; a section too big for one chunk starts a new
    # chunk and is cut at paragraphs (then lines, sentences, characters) inside it.
    for section in _sections(text, kind):
        if count_tokens(section) <= max_tokens:
            add(section, may_join=True)
            continue
        first = True
        for block in _blocks(section, kind):
            for piece in _split_long(block, max_tokens, count_tokens):
                add(piece, may_join=not first)
                first = False
    chunks = []
    for piece in packed:
        body = piece.strip()
        if not body:  # whitespace only: fold into the previous chunk's trail
            if chunks:
                last = chunks[-1]
                chunks[-1] = Chunk(last.lead, last.body, last.trail + piece)
            else:
                chunks.append(Chunk(piece, "", ""))
            continue
        start = piece.index(body)
        chunks.append(Chunk(piece[:start], body, piece[start + len(body) :]))
    return chunks


def join_chunks(chunks: list[Chunk], bodies: list[str]) -> str:
    """The document with each chunk's body replaced, its surrounding whitespace kept."""
    if len(bodies) != len(chunks):
        raise ValueError(f"{len(chunks)} chunks but {len(bodies)} bodies")
    return "".join(c.lead + b + c.trail for c, b in zip(chunks, bodies))

"""Rewrite or summarize whole documents, chunk by chunk, with the speculator (the CLI's engine).

    model, tokenizer = load_model()
    job = DocumentJob(model, tokenizer, NgramSpeculator())
    text = job.rewrite(document, "Fix grammar and spelling.")          # or job.summarize(document)

A rewrite splits the document along natural boundaries (``chunking.py``), rewrites each chunk
with the instruction (plus, after the first chunk, the end of the previous rewritten chunk as
context) and joins the results with the document's own blank lines and indentation. A summary
summarizes each chunk and then, when there were several, the chunk summaries together.
``on_chunk`` callbacks let a caller stream, show progress and save finished chunks (resume).
Each rewritten chunk's similarity to its source is recorded, and with ``keep_below`` a chunk
whose rewrite drifted further than that (a small model may answer with something unrelated)
is kept as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from rapidfuzz import fuzz

from .chunking import Chunk, join_chunks, split_document
from .metrics import DecodeStats

# Defaults of a DocumentJob, which the CLI's options read from here.
SUMMARIZE_INSTRUCTION = "Summarize the following text in a few sentences."
CHUNK_TOKENS = 768  # largest chunk, in tokens (DocumentJob lowers it further for a short context)
MIN_CHUNK_TOKENS = 32  # smallest allowed: a chunk of a sentence or two gives the model too little context
SUMMARY_TOKENS = 256  # new tokens per chunk summary when max_new_tokens is not given
CONTEXT_CHARS = 300  # how much of the previous rewritten chunk is shown as context


@dataclass
class JobStats:
    """Totals over a document's chunks (what ``--stats`` prints)."""

    chunks: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    seconds: float = 0.0
    verify_cost: float = 0.0  # sum over forwards of cost(q) relative to one token
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    per_chunk: list = field(default_factory=list)
    similarities: list = field(default_factory=list)  # of each rewritten chunk to its source
    kept: list = field(default_factory=list)  # (chunk index, similarity) of drifted chunks kept as they were

    def add(self, stats: DecodeStats, seconds: float, cost: Callable[[int], float] | None) -> None:
        self.chunks += 1
        self.new_tokens += stats.new_tokens
        self.target_forwards += stats.target_forwards
        self.seconds += seconds
        self.drafted_tokens += stats.drafted_tokens
        self.accepted_tokens += stats.accepted_tokens
        steps = stats.verified_per_step or [0] * (stats.target_forwards - 1)
        self.verify_cost += 1.0 + sum(cost(k + 1) if cost else 1.0 for k in steps)
        self.per_chunk.append({"new_tokens": stats.new_tokens, "mat": round(stats.mat, 3),
                               "seconds": round(seconds, 3)})

    @property
    def mat(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    def as_dict(self) -> dict:
        return {
            "chunks": self.chunks,
            "seconds": round(self.seconds, 3),
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "mat": round(self.mat, 3),
            "tokens_per_second": round(self.new_tokens / self.seconds, 2) if self.seconds else 0.0,
            "acceptance_rate": round(self.accepted_tokens / self.drafted_tokens, 3) if self.drafted_tokens else 0.0,
            # plain decoding needs one one-token forward per token; speculation paid verify_cost
            "speedup_estimate": round(self.new_tokens / self.verify_cost, 3) if self.verify_cost else 1.0,
            "similarity_min": round(min(self.similarities), 3) if self.similarities else None,
            "similarity_mean": round(sum(self.similarities) / len(self.similarities), 3) if self.similarities else None,
            "kept_chunks": len(self.kept),
        }


class DocumentJob:
    """Generation settings shared by every chunk of a document."""

    def __init__(self, model, tokenizer, speculator=None, max_new_tokens: int | None = None,
                 chunk_tokens: int = CHUNK_TOKENS, sample: bool = False, temperature: float = 1.0,
                 seed: int | None = None, streamer_factory: Callable | None = None):
        self.model, self.tokenizer, self.speculator = model, tokenizer, speculator
        self.max_new_tokens, self.sample, self.temperature, self.seed = max_new_tokens, sample, temperature, seed
        self.streamer_factory = streamer_factory
        limit = getattr(model.config, "max_position_embeddings", None) or 8192
        # A chunk, its prompt and its output must fit the context: cap chunks accordingly.
        self.chunk_tokens = max(MIN_CHUNK_TOKENS, min(chunk_tokens, (limit - 256) // 3))
        self.context_limit = limit
        self.stats = JobStats()

    # -- pieces -------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chunks(self, document: str, kind: str) -> list[Chunk]:
        return split_document(document, self.chunk_tokens, self.count_tokens, kind)

    def prompt_ids(self, instruction: str, body: str, context: str = "") -> torch.Tensor:
        """(1, P) chat-template ids: the instruction, optional context, a blank line, the text."""
        content = instruction.strip() + "\n\n"
        if context:
            content += f"(For consistency, the preceding part of the document ends with: \"...{context}\")\n\n"
        content += body
        messages = [{"role": "user", "content": content}]
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return torch.tensor([list(encoded["input_ids"])], device=self.model.device)

    def generate(self, ids: torch.Tensor, max_new_tokens: int) -> str:
        """One chunk: speculative (or plain) generation, stats recorded, text returned."""
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=self.sample,
                      pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                      else self.tokenizer.eos_token_id)
        if self.sample:
            kwargs["temperature"] = self.temperature
            if self.seed is not None:
                torch.manual_seed(self.seed + self.stats.chunks)
        else:  # greedy: do not inherit sampling knobs from the model's generation config
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if self.streamer_factory is not None:
            kwargs["streamer"] = self.streamer_factory()
        if self.speculator is not None:
            kwargs["ngram_speculator"] = self.speculator
        start = time.perf_counter()
        out = self.model.generate(ids, **kwargs)
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1] :]
        if self.speculator is not None:
            stats = self.speculator.last_stats
            cost_model, context = self.speculator.cost_model, ids.shape[1]

            def cost(tokens: int) -> float:
                return float(cost_model(tokens, context))
        else:
            stats = DecodeStats(prompt_tokens=ids.shape[1], new_tokens=int(new.shape[0]),
                                target_forwards=int(new.shape[0]))
            cost = None
        self.stats.add(stats, seconds, cost)
        return self.tokenizer.decode(new, skip_special_tokens=True)

    def _budget(self, body: str) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return min(2 * self.count_tokens(body) + 64, self.context_limit // 2)

    # -- whole documents ----------------------------------------------------------------------
    def rewrite(self, document: str, instruction: str, kind: str = "text", done: dict | None = None,
                on_chunk: Callable[[int, Chunk, str], None] | None = None, keep_below: float | None = None) -> str:
        """The rewritten document. ``done`` maps chunk index -> text already rewritten (resume);
        ``on_chunk(i, chunk, text)`` is called after each chunk (including resumed ones). A
        chunk whose rewrite has a :func:`similarity` to its source below ``keep_below`` keeps
        its source text (listed in ``stats.kept``)."""
        chunks = self.chunks(document, kind)
        bodies: list[str] = []
        for i, chunk in enumerate(chunks):
            if done is not None and i in done:
                text = done[i]
            elif not chunk.body:
                text = ""
            else:
                context = bodies[-1][-CONTEXT_CHARS:] if bodies else ""
                text = clean_output(self.generate(self.prompt_ids(instruction, chunk.body, context),
                                                  self._budget(chunk.body)), chunk.body)
                score = similarity(chunk.body, text)
                self.stats.similarities.append(score)
                if keep_below is not None and score < keep_below:
                    self.stats.kept.append((i, score))
                    text = chunk.body
            bodies.append(text)
            if on_chunk is not None:
                on_chunk(i, chunk, text)
        return join_chunks(chunks, bodies)

    def summarize(self, document: str, instruction: str = SUMMARIZE_INSTRUCTION, kind: str = "text",
                  done: dict | None = None, on_chunk: Callable[[int, Chunk, str], None] | None = None) -> str:
        """Summary of each chunk, then (several chunks) a summary of those summaries."""
        chunks = [c for c in self.chunks(document, kind) if c.body]
        budget = self.max_new_tokens or SUMMARY_TOKENS
        summaries = []
        for i, chunk in enumerate(chunks):
            if done is not None and i in done:
                text = done[i]
            else:
                text = clean_output(self.generate(self.prompt_ids(instruction, chunk.body), budget), chunk.body)
            summaries.append(text)
            if on_chunk is not None:
                on_chunk(i, chunk, text)
        if len(summaries) == 1:
            return summaries[0] + "\n"
        joined = "\n\n".join(summaries)
        if self.count_tokens(joined) > self.chunk_tokens:  # still too long: summarize again
            return self.summarize(joined, instruction, "text")
        return clean_output(self.generate(self.prompt_ids(instruction, joined), budget), joined) + "\n"


def similarity(source: str, text: str) -> float:
    """How much of ``source`` a rewrite kept, in [0, 1]: rapidfuzz's Indel ratio (1 - edits /
    total length), 1.0 for identical text."""
    return fuzz.ratio(source, text) / 100


def clean_output(text: str, source: str) -> str:
    """The model's reply without surrounding blank space, and without a code fence it wrapped
    around the whole reply when the source had none."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and not source.lstrip().startswith("```"):
        inner = text[3:-3]
        inner = inner.split("\n", 1)[1] if "\n" in inner else inner  # drop a language tag line
        text = inner.strip()
    return text

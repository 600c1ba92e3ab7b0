"""Rewrite or summarize whole documents, chunk by chunk, with the speculator (the CLI's engine).

    model, tokenizer = load_model()
    job = DocumentJob(model, tokenizer, NgramSpeculator())
    text = job.rewrite(document, "Fix grammar and spelling.")          # or job.summarize(document)

A rewrite splits the document along natural boundaries (``chunking.py``), rewrites each chunk
with the instruction (plus, after the first chunk, the end of the previous rewritten chunk as
context) and joins the results with the document's own blank lines and indentation. A summary
summarizes each chunk and then, when there were several, the chunk summaries together.
``on_chunk`` callbacks let a caller stream, show progress and save finished chunks (resume).
Every chunk is guarded (``guard.py``): its generation stops once it loops or runs past the
length bound, and a rewrite that drifted (low similarity, too long, broken structure) is
discarded and the chunk kept as it was, listed in ``stats.guarded``. A summary that loops
raises :class:`DegenerateOutput` rather than return garbage. Every number that tunes this
(chunk size, context shown, summary length, the guard's floor and bounds) is a field of the
job's :class:`~ngramspec.app.settings.JobSettings`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from transformers import StoppingCriteriaList

from ..draft.metrics import DecodeStats
from ..hf.hook import install
from .chunking import Chunk, join_chunks, split_document
from .guard import LoopStop, drift_reason, length_bound, similarity
from .settings import JobSettings

# The summarize command's default instruction (the CLI's --instruction default reads it here).
SUMMARIZE_INSTRUCTION = "Summarize the following text in a few sentences."


@dataclass
class JobStats:
    """Totals over a document's chunks (what ``--stats`` prints). Speed figures count only the
    chunks whose rewrite was used: a guarded chunk's output was thrown away, and degenerate
    output drafts fast, so counting it would make the figures best when the output is worst."""

    seconds: float = 0.0  # all generation, guarded chunks included
    per_chunk: list = field(default_factory=list)  # one record per generated chunk
    similarities: list = field(default_factory=list)  # of each rewritten chunk to its source
    guarded: list = field(default_factory=list)  # (chunk index, why) of chunks kept as they were

    def add(self, stats: DecodeStats, seconds: float, cost: Callable[[int], float] | None) -> None:
        self.seconds += seconds
        steps = stats.verified_per_step or [0] * (stats.target_forwards - 1)
        self.per_chunk.append({
            "new_tokens": stats.new_tokens, "target_forwards": stats.target_forwards, "seconds": seconds,
            "drafted_tokens": stats.drafted_tokens, "accepted_tokens": stats.accepted_tokens,
            # sum over forwards of cost(q) relative to a one-token forward
            "verify_cost": 1.0 + sum(cost(k + 1) if cost else 1.0 for k in steps), "guarded": False})

    def guard_last(self, index: int, why: str) -> None:
        """The chunk just generated is kept as it was (its output is not used)."""
        self.guarded.append((index, why))
        if self.per_chunk:
            self.per_chunk[-1]["guarded"] = True

    def _used(self, key: str):
        return sum(c[key] for c in self.per_chunk if not c["guarded"])

    @property
    def chunks(self) -> int:
        return len(self.per_chunk)

    @property
    def new_tokens(self) -> int:
        return self._used("new_tokens")

    @property
    def used_seconds(self) -> float:
        return self._used("seconds")

    @property
    def mat(self) -> float:
        forwards = self._used("target_forwards")
        return self.new_tokens / forwards if forwards else 0.0

    def as_dict(self) -> dict:
        seconds, drafted, cost = self.used_seconds, self._used("drafted_tokens"), self._used("verify_cost")
        return {
            "chunks": self.chunks,
            "guarded_chunks": len(self.guarded),
            "seconds": round(self.seconds, 3),
            # the rest counts the chunks whose rewrite was used
            "new_tokens": self.new_tokens,
            "target_forwards": self._used("target_forwards"),
            "mat": round(self.mat, 3),
            "tokens_per_second": round(self.new_tokens / seconds, 2) if seconds else 0.0,
            "acceptance_rate": round(self._used("accepted_tokens") / drafted, 3) if drafted else 0.0,
            # plain decoding needs one one-token forward per token; speculation paid verify_cost
            "speedup_estimate": round(self.new_tokens / cost, 3) if cost else 1.0,
            "similarity_min": round(min(self.similarities), 3) if self.similarities else None,
            "similarity_mean": round(sum(self.similarities) / len(self.similarities), 3) if self.similarities else None,
        }


class DocumentJob:
    """Generation settings shared by every chunk of a document. ``settings`` (a
    :class:`JobSettings`, its defaults when None) tunes chunking and the guard; a field of it
    may also be given by name, e.g. ``DocumentJob(model, tokenizer, chunk_tokens=256,
    similarity_floor=0)`` (a floor of 0 turns the drift guard off), checked as the dataclass
    checks it. Installs the ``generate()`` hook it decodes through (:func:`ngramspec.install`)."""

    def __init__(self, model, tokenizer, speculator=None, max_new_tokens: int | None = None,
                 sample: bool = False, temperature: float = 1.0, seed: int | None = None,
                 streamer_factory: Callable | None = None, settings: JobSettings | None = None, **changes):
        self.model, self.tokenizer, self.speculator = model, tokenizer, speculator
        self.max_new_tokens, self.sample, self.temperature, self.seed = max_new_tokens, sample, temperature, seed
        self.streamer_factory = streamer_factory
        self.settings = replace(settings or JobSettings(), **changes)
        limit = getattr(model.config, "max_position_embeddings", None) or self.settings.assumed_context_tokens
        # A chunk, its prompt and its output must fit the context: cap chunks accordingly (the
        # chunk, its copy in the prompt and its rewrite take a third each of what the prompt's
        # own tokens leave).
        fitting = (limit - self.settings.prompt_tokens) // 3
        self.chunk_tokens = max(self.settings.min_chunk_tokens, min(self.settings.chunk_tokens, fitting))
        self.context_limit = limit
        self.stats = JobStats()
        install()
        self.last_stop = ""  # why the last generate() stopped early: "loop", "length" or ""

    # -- pieces -------------------------------------------------------------------------------
    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def count_tokens(self, text: str) -> int:
        return len(self.token_ids(text))

    def chunks(self, document: str, kind: str) -> list[Chunk]:
        return split_document(document, self.chunk_tokens, self.count_tokens, kind)

    def prompt_ids(self, instruction: str, body: str, context: str = "") -> torch.Tensor:
        """(1, P) chat-template ids: the instruction, optional context, a blank line, the text.
        (System prompts and example turns did not help the default model:
        eval/results/realdocs/prompts.md.)"""
        content = instruction.strip() + "\n\n"
        if context:
            content += f"(For consistency, the preceding part of the document ends with: \"...{context}\")\n\n"
        content += body
        messages = [{"role": "user", "content": content}]
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return torch.tensor([list(encoded["input_ids"])], device=self.model.device)

    def generate(self, ids: torch.Tensor, max_new_tokens: int, source: str | None = None) -> str:
        """One chunk: speculative (or plain) generation, stats recorded, text returned. With
        ``source``, generation stops once the output loops where ``source`` does not
        (``self.last_stop`` says "loop"; "length" when it used all ``max_new_tokens``)."""
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=self.sample,
                      pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                      else self.tokenizer.eos_token_id)
        if self.sample:
            kwargs["temperature"] = self.temperature
            if self.seed is not None:
                torch.manual_seed(self.seed + self.stats.chunks)
        else:  # greedy: do not inherit sampling knobs from the model's generation config
            kwargs.update(temperature=None, top_p=None, top_k=None)
        loop_stop = None
        if source is not None:
            loop_stop = LoopStop(self.token_ids(source), ids.shape[1], self.settings)
            kwargs["stopping_criteria"] = StoppingCriteriaList([loop_stop])
        if self.streamer_factory is not None:
            kwargs["streamer"] = self.streamer_factory()
        if self.speculator is not None:
            kwargs["ngram_speculator"] = self.speculator
        start = time.perf_counter()
        out = self.model.generate(ids, **kwargs)
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1] :]
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if loop_stop is not None and loop_stop.fired:
            self.last_stop = "loop"
        elif new.shape[0] >= max_new_tokens and int(new[-1]) not in eos:
            self.last_stop = "length"
        else:
            self.last_stop = ""
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
        """New tokens for a rewrite of ``body``: the guard's length bound (a longer rewrite would
        be discarded anyway), or --max-new-tokens; never more than half the context."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return min(length_bound(self.count_tokens(body), self.settings), self.context_limit // 2)

    # -- whole documents ----------------------------------------------------------------------
    def rewrite(self, document: str, instruction: str, kind: str = "text", done: dict | None = None,
                on_chunk: Callable[[int, Chunk, str], None] | None = None) -> str:
        """The rewritten document. ``done`` maps chunk index -> text already rewritten (resume);
        ``on_chunk(i, chunk, text)`` is called after each chunk (including resumed ones). A
        chunk whose rewrite drifted (``guard.drift_reason``) keeps its source text and is
        listed in ``stats.guarded`` with the reason."""
        chunks = self.chunks(document, kind)
        bodies: list[str] = []
        for i, chunk in enumerate(chunks):
            if done is not None and i in done:
                text = done[i]
            elif not chunk.body:
                text = ""
            else:
                context = bodies[-1][-self.settings.context_chars:] if bodies and self.settings.context_chars else ""
                self.last_stop = ""
                text = clean_output(self.generate(self.prompt_ids(instruction, chunk.body, context),
                                                  self._budget(chunk.body), source=chunk.body), chunk.body)
                self.stats.similarities.append(similarity(chunk.body, text))
                why = drift_reason(chunk.body, text, kind, self.settings, stopped=self.last_stop)
                if why:
                    self.stats.guard_last(i, why)
                    text = chunk.body
            bodies.append(text)
            if on_chunk is not None:
                on_chunk(i, chunk, text)
        return join_chunks(chunks, bodies)

    def _summary(self, instruction: str, body: str, budget: int) -> str:
        self.last_stop = ""
        text = clean_output(self.generate(self.prompt_ids(instruction, body), budget, source=body), body)
        if self.last_stop == "loop":
            raise DegenerateOutput(f"the model's summary repeated itself until it was stopped: "
                                   f"{text[:120]!r}...")
        return text

    def summarize(self, document: str, instruction: str = SUMMARIZE_INSTRUCTION, kind: str = "text",
                  done: dict | None = None, on_chunk: Callable[[int, Chunk, str], None] | None = None) -> str:
        """Summary of each chunk, then (several chunks) a summary of those summaries. Raises
        :class:`DegenerateOutput` when a summary loops (``guard.LoopStop``)."""
        chunks = [c for c in self.chunks(document, kind) if c.body]
        budget = self.max_new_tokens or self.settings.summary_tokens
        summaries = []
        for i, chunk in enumerate(chunks):
            text = done[i] if done is not None and i in done else self._summary(instruction, chunk.body, budget)
            summaries.append(text)
            if on_chunk is not None:
                on_chunk(i, chunk, text)
        if len(summaries) == 1:
            return summaries[0] + "\n"
        joined = "\n\n".join(summaries)
        if self.count_tokens(joined) > self.chunk_tokens:  # still too long: summarize again
            return self.summarize(joined, instruction, "text")
        return self._summary(instruction, joined, budget) + "\n"


class DegenerateOutput(RuntimeError):
    """The model's output degenerated (it looped); nothing usable to return."""


__all__ = ["DegenerateOutput", "DocumentJob", "JobStats", "clean_output", "similarity"]


def clean_output(text: str, source: str) -> str:
    """The model's reply without surrounding blank space, and without a code fence it wrapped
    around the whole reply when the source had none."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and not source.lstrip().startswith("```"):
        inner = text[3:-3]
        inner = inner.split("\n", 1)[1] if "\n" in inner else inner  # drop a language tag line
        text = inner.strip()
    return text

"""Differential fuzzing: ngramspec's generate() against transformers' own generate().

    python tests/fuzz.py --cases 500 --seed 0          # last line: "500 cases, M mismatches"
    python tests/fuzz.py --cases 1 --seed 0 --case 17  # run only case 17 of seed 0
    python tests/fuzz.py --cases 125 --first 250       # cases 250-374 of seed 0 (a share)

Every case is drawn from (seed, case index) alone: a tiny random model built from a config
(Llama, Qwen2, GPT-2, or Mistral with a sliding window of 8-16 tokens, so the window really
slides; float64 weights, so a multi-token verify forward equals one-token forwards far below any
logit gap; built once per (family, model seed, window) and reused), a prompt with planted
repeats (copies of earlier spans, copies with a substitution/insertion/deletion, loops), random
speculator settings (only valid SpeculatorConfig combinations: n-gram sizes, draft length,
match policy, payoff sizing, verify_cost None = the online cost model or a fixed curve,
acceptance prior/memory, copy cursor, fuzzy resync, token trees, shared history, edit recurrence), and a
generation path: one prompt or a left-padded batch of 2-3 rows with its attention mask; logits
processors (repetition_penalty, no_repeat_ngram_size, min_new_tokens, suppress_tokens,
bad_words_ids, prefix_allowed_tokens_fn, a user LogitsProcessor); a user StoppingCriteria; stop
strings (through a 40-token character tokenizer built in memory); no EOS, one, or several EOS
ids; max_new_tokens or max_length; output_scores/output_logits; a static cache; and the
"all positions at once" verify mode (the accelerator path, forced on CPU).

Checks:
* greedy: the sequences equal plain generate()'s token for token, and so do the scores and
  logits (rows still running) when they are requested, to SCORE_RTOL: generate() returns them
  in float32, and the float64 model's logits from a multi-token verify differ from one-token
  forwards by ~1e-15, which now and then rounds to the neighbouring float32 value;
* seeded sampling: speculative sampling follows plain sampling's *distribution* but draws each
  output position with its own uniform (ngramspec.hf.verify.Uniforms), so the same seed does NOT
  give plain generate()'s tokens (tests/test_sampling.py checks the distributions with
  chi-square tests). It gives exactly the tokens of the same request decoded without any draft,
  which every sampling case checks; and the output is valid: the prompt is kept, token ids are
  in the vocabulary, no more than the allowed new tokens, rows stop exactly at their first EOS /
  stop string / user criterion and (when there are EOS ids: only then does generate() pad) are
  padded after it, a row that never stops runs to the limit, and tokens forbidden by
  suppress_tokens, bad_words_ids, no_repeat_ngram_size, min_new_tokens, prefix_allowed_tokens_fn
  or the user processor never appear. To check the checker, plain greedy outputs are held to the
  same rules and the number that break one is printed (plain generate() breaks a rule only where
  no token could keep it, e.g. every allowed token banned; that count should stay a small
  fraction);
* refused requests (beam search, output_attentions, assisted decoding, a batch-state
  processor in a batch; about 3% of cases; and a batch with stop strings or a user stop but
  no EOS id) must raise UnsupportedGenerationError.

Each mismatch (an exception too, unless plain generate() raises the same type with the same
message on the same request, or a validity failure) prints one line that reproduces it. With
verify_cost=None the online cost model times forwards, so draft sizes (never the greedy
output) may differ between runs of the same case. ``--inject-fault`` makes the verifier keep
the first rejected draft token of each case (a wrong token emitted), to show that the runner
catches a faulty speculator. Exit code 1 if any case mismatched.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from pathlib import Path

import numpy as np
import torch
from transformers import (
    ClassifierFreeGuidanceLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.utils import logging as hf_logging

from ngramspec import NgramSpeculator, install
from ngramspec.hf import verify
from ngramspec.hf.target import left_pad

V = 40  # vocabulary of every tiny model
SCORE_RTOL = 4 * 2.0**-23  # 4 float32 ulps (seed 7, case 6298: one ulp, 1.2e-7 on a logit near 1.5)
BOS, EOS, PAD = 0, 1, 1
MAX_POSITIONS = 256
FAMILIES = ("llama", "qwen2", "gpt2", "mistral")
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,"  # token 2 + i is CHARS[i]
TOKEN_TEXT = ["<s>", "</s>"] + list(CHARS)
COST_CURVES = (
    None,  # the online cost model
    None,
    ((1, 1.0), (8, 1.2)),
    ((1, 1.0), (64, 1.0)),  # flat: every draft pays
    ((1, 1.0), (2, 1.6), (8, 1.9), (16, 2.45)),
    ((1, 1.0), (2, 2.0)),  # steep: drafts rarely pay
)


def plain_generate(model, ids, **kwargs):
    """transformers' own generate, bypassing the ngramspec wrapper entirely."""
    from transformers import GenerationMixin

    return GenerationMixin.generate._ngramspec_original(model, ids, **kwargs)


# --- models and tokenizer ------------------------------------------------------------------------

_MODELS: dict = {}
_TOKENIZER: list = []


def tiny_model(family: str, seed: int, window: int = 16):
    key = (family, seed, window)
    if key not in _MODELS:
        import transformers as tf

        torch.manual_seed(1000 + seed)
        common = dict(vocab_size=V, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
        sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS)
        if family == "llama":
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**sizes, **common))
        elif family == "qwen2":
            model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**sizes, **common))
        elif family == "mistral":
            model = tf.MistralForCausalLM(tf.MistralConfig(**sizes, **common, sliding_window=window))
        else:  # learned absolute positions, fused QKV, no GQA
            model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POSITIONS,
                                                     **common))
        model = model.to(torch.float64).eval()
        with torch.no_grad():  # larger weights: peaked, repetitive greedy text (drafts accepted)
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(8.0)
        gc = model.generation_config
        gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = BOS, EOS, PAD
        _MODELS[key] = model
    return _MODELS[key]


def char_tokenizer():
    """One character per token (ids as in TOKEN_TEXT), built in memory: enough for stop strings."""
    if not _TOKENIZER:
        from tokenizers import Tokenizer, decoders, models
        from transformers import PreTrainedTokenizerFast

        vocab = {text: i for i, text in enumerate(TOKEN_TEXT)}
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="</s>"))
        backend.decoder = decoders.Fuse()
        _TOKENIZER.append(PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                  pad_token="</s>"))
    return _TOKENIZER[0]


# --- drawing a case ------------------------------------------------------------------------------


def make_prompt(rng, length: int) -> list[int]:
    """Random tokens (never BOS/EOS/PAD) with planted repeats: exact copies of earlier spans,
    copies with one substitution/insertion/deletion, and short loops."""
    tokens = rng.integers(2, V, size=int(rng.integers(1, 10))).tolist()
    while len(tokens) < length:
        op = rng.choice(["copy", "edit", "edit", "loop", "fresh"])
        if op == "fresh":
            tokens += rng.integers(2, V, size=int(rng.integers(1, 6))).tolist()
            continue
        if op == "loop":
            phrase = rng.integers(2, V, size=int(rng.integers(1, 5))).tolist()
            tokens += phrase * int(rng.integers(2, 6))
            continue
        start = int(rng.integers(0, len(tokens)))
        span = tokens[start : start + int(rng.integers(2, 16))]
        if op == "edit" and len(span) > 1:
            at = int(rng.integers(0, len(span)))
            kind = rng.choice(["substitute", "insert", "delete"])
            if kind == "substitute":
                span[at] = int(rng.integers(2, V))
            elif kind == "insert":
                span.insert(at, int(rng.integers(2, V)))
            else:
                del span[at]
        tokens += span
    return tokens[:length]


def draw_settings(rng) -> dict:
    min_n = int(rng.integers(1, 4))
    max_draft = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16]))
    settings = dict(
        min_n=min_n,
        max_n=min_n + int(rng.integers(0, 6)),
        max_draft_tokens=max_draft,
        match=str(rng.choice(["recent", "earliest"])),
        payoff_sizing=bool(rng.random() < 0.6),
        verify_cost=COST_CURVES[int(rng.integers(len(COST_CURVES)))],
        acceptance_prior=round(float(rng.uniform(0.05, 0.95)), 2),
        acceptance_memory=round(float(rng.uniform(0.0, 1.0)), 2),
        copy_cursor=bool(rng.random() < 0.7),
        fuzzy_resync=bool(rng.random() < 0.6),
        tree_branches=1 if rng.random() < 0.6 else int(rng.integers(2, 5)),
        history_tokens=0 if rng.random() < 0.7 else int(rng.choice([40, 300, 5000])),
        edit_recurrence=bool(rng.random() < 0.3),
    )
    settings["max_tree_tokens"] = max_draft + int(rng.choice([0, 2, 8, 16]))
    return settings


def draw_case(seed: int, index: int) -> dict:
    """Everything a case does, from (seed, index) alone."""
    rng = np.random.default_rng([seed, index])
    family = str(rng.choice(FAMILIES))
    case = dict(family=family, model_seed=int(rng.integers(2)),
                window=int(rng.choice([8, 12, 16])) if family == "mistral" else 16)
    case["settings"] = draw_settings(rng)
    sample = bool(rng.random() < 0.25)
    rows = 1 if rng.random() < 0.6 else int(rng.integers(2, 4))
    short = rng.random() < 0.1
    case["prompts"] = [make_prompt(rng, int(rng.integers(1, 4)) if short else int(rng.integers(4, 70)))
                       for _ in range(rows)]
    kw: dict = dict(do_sample=sample)
    if sample:
        kw["temperature"] = round(float(rng.uniform(0.3, 1.5)), 2)
        if rng.random() < 0.3:
            kw["top_k"] = int(rng.integers(2, 20))
        if rng.random() < 0.3:
            kw["top_p"] = round(float(rng.uniform(0.5, 0.95)), 2)
        if rows == 1 and rng.random() < 0.3:
            kw["num_return_sequences"] = int(rng.integers(2, 4))
    new = int(rng.integers(1, 49))
    if rng.random() < 0.25:
        kw["max_length"] = max(len(p) for p in case["prompts"]) + new
    else:
        kw["max_new_tokens"] = new
    seen = sorted({t for p in case["prompts"] for t in p})
    eos = rng.random()
    if eos < 0.15:
        kw["eos_token_id"] = None
    elif eos < 0.45:  # several EOS ids, likely to be generated: tokens of the prompt
        kw["eos_token_id"] = [EOS] * bool(rng.random() < 0.5) + rng.choice(seen, size=min(len(seen), 2)).tolist()
        kw["eos_token_id"] = [int(t) for t in kw["eos_token_id"]]
    if rng.random() < 0.2:
        kw["repetition_penalty"] = round(float(rng.choice([0.7, 1.2, 1.5])), 2)
    if rng.random() < 0.12:
        kw["no_repeat_ngram_size"] = int(rng.integers(2, 5))
    if rng.random() < 0.12:
        kw["min_new_tokens"] = int(rng.integers(1, new + 1))
    if rng.random() < 0.12:
        kw["suppress_tokens"] = [int(t) for t in rng.choice(seen, size=min(len(seen), 2), replace=False)]
    if rng.random() < 0.12:
        words = [[int(rng.choice(seen))], [int(rng.choice(seen)), int(rng.choice(seen))]]
        kw["bad_words_ids"] = [w for w in words if w != [EOS]]
    extras = dict(
        prefix_fn=rng.random() < 0.06,
        user_processor=rng.random() < 0.08,
        user_stop=int(rng.choice(seen)) if rng.random() < 0.08 else None,
        stop_strings=None,
        static_cache=family in ("llama", "qwen2") and rows == 1 and not sample and rng.random() < 0.08,
        all_at_once=bool(rng.random() < 0.3),
        scores=not sample and rng.random() < 0.15,
    )
    if rng.random() < 0.12:  # stop strings made of prompt text, so they do occur
        strings = []
        for _ in range(int(rng.integers(1, 3))):
            p = case["prompts"][int(rng.integers(rows))]
            at = int(rng.integers(len(p)))
            strings.append("".join(TOKEN_TEXT[t] for t in p[at : at + int(rng.integers(1, 4))]))
        extras["stop_strings"] = strings
    # A few requests the speculator documents as refused: they must raise its error, not decode.
    extras["refused"] = str(rng.choice(list(REFUSED))) if rng.random() < 0.03 else None
    extras["ones_mask"] = rows == 1 and bool(rng.random() < 0.5)  # an explicit all-ones mask for one row
    case["generate"], case["extras"] = kw, extras
    case["path"] = ("sample" if sample else "greedy") + (f"/batch{rows}" if rows > 1 else "")
    return case


# Refused requests (ngramspec.hf.checks) -> the extra generate() arguments that make them.
REFUSED = {
    "beam_search": lambda: dict(num_beams=2),
    "output_attentions": lambda: dict(return_dict_in_generate=True, output_attentions=True),
    "assisted": lambda: dict(prompt_lookup_num_tokens=4),
    "cfg_in_batch": lambda: dict(logits_processor=LogitsProcessorList([ClassifierFreeGuidanceLogitsProcessor(1.5)])),
}

# --- running one case ----------------------------------------------------------------------------


class BanAfter(LogitsProcessor):
    """A user LogitsProcessor that depends on the prefix: after token 2, token 4 is banned."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[input_ids[:, -1] == 2, 4] = -float("inf")
        return scores


def allowed_tokens(batch_id, sentence):
    """prefix_allowed_tokens_fn: after an odd token, row b may only use tokens 2+3b .. 11+3b."""
    return list(range(2 + 3 * batch_id, 12 + 3 * batch_id)) if int(sentence[-1]) % 2 else list(range(V))


def generate_kwargs(case: dict, ids, mask) -> dict:
    kw = dict(case["generate"])
    ex = case["extras"]
    if mask is not None:
        kw["attention_mask"] = mask
    if ex["prefix_fn"]:
        kw["prefix_allowed_tokens_fn"] = allowed_tokens
    if ex["user_processor"]:
        kw["logits_processor"] = LogitsProcessorList([BanAfter()])
    if ex["user_stop"] is not None:
        token = ex["user_stop"]

        class StopAfterToken(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return input_ids[:, -1] == token

        kw["stopping_criteria"] = StoppingCriteriaList([StopAfterToken()])
    if ex["stop_strings"]:
        kw["stop_strings"], kw["tokenizer"] = list(ex["stop_strings"]), char_tokenizer()
    if ex["static_cache"]:
        kw["cache_implementation"] = "static"
    if ex["scores"]:
        kw.update(return_dict_in_generate=True, output_scores=True, output_logits=True)
    return kw


@contextlib.contextmanager
def patched(all_at_once: bool, fault: bool):
    """Force the all-positions-at-once verify mode, and/or inject the fault (keep the first
    rejected draft token of the case: a wrong token is emitted)."""
    saved = verify.reads_all_positions_at_once, verify.follow
    if all_at_once:
        verify.reads_all_positions_at_once = lambda logits: True
    if fault:
        original, done = verify.follow, []

        def faulty_follow(draft, parents, choice):
            emitted, path = original(draft, parents, choice)
            if not done and parents is None and len(path) < len(draft) and emitted \
                    and len(emitted) == len(path) + 1 and emitted[-1] != int(draft[len(path)]):
                done.append(1)
                emitted = emitted[:-1] + [int(draft[len(path)])]  # "accept" the rejected token
            return emitted, path

        verify.follow = faulty_follow
    try:
        yield
    finally:
        verify.reads_all_positions_at_once, verify.follow = saved


@contextlib.contextmanager
def no_drafts():
    """Every session proposes nothing: each step is a plain one-token step."""
    from ngramspec.draft.proposal import Draft
    from ngramspec.draft.session import SpeculationSession

    original = SpeculationSession.propose
    SpeculationSession.propose = lambda self, *a, **k: Draft(np.zeros(0, dtype=np.int32))
    try:
        yield
    finally:
        SpeculationSession.propose = original


def eos_ids(kw: dict) -> set:
    eos = kw.get("eos_token_id", EOS)
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def stop_index(case: dict, kw: dict, row: list[int], width: int) -> int | None:
    """Position of the row's first EOS / user stop token / stop string, None if none. As in
    transformers' StopStringCriteria, a stop string counts once it ends anywhere inside the
    latest token (a stop string "s" stops at the token "<s>")."""
    eos, ex = eos_ids(kw), case["extras"]
    stops = ex["stop_strings"] or []
    text = "".join(TOKEN_TEXT[t] for t in row[:width])
    for t in range(width, len(row)):
        before = len(text)
        text += TOKEN_TEXT[row[t]]
        if row[t] in eos or row[t] == ex["user_stop"] or any(s in text[max(0, before - len(s) + 1) :] for s in stops):
            return t
    return None


def validity_problem(case: dict, kw: dict, ids, out) -> str | None:
    """Rules every output must keep (greedy or sampled); None if it keeps them all."""
    rows_in, width = ids.shape
    copies = kw.get("num_return_sequences", 1)
    if out.shape[0] != rows_in * copies:
        return f"{out.shape[0]} rows returned for {rows_in} x {copies}"
    if not torch.equal(out[:, :width], ids.repeat_interleave(copies, dim=0)):
        return "the prompt was changed"
    limit = kw["max_new_tokens"] if "max_new_tokens" in kw else kw["max_length"] - width
    new = out.shape[1] - width
    if not 1 <= new <= limit:
        return f"{new} new tokens, limit {limit}"
    if out.min() < 0 or out.max() >= V:
        return "token id outside the vocabulary"
    eos = eos_ids(kw)
    ex = case["extras"]
    n_gram = kw.get("no_repeat_ngram_size")
    # (generate() drops single-token bad words that are EOS ids)
    banned = set(kw.get("suppress_tokens") or []) | {w[0] for w in kw.get("bad_words_ids") or []
                                                     if len(w) == 1 and w[0] not in eos}
    pairs = {tuple(w) for w in kw.get("bad_words_ids") or [] if len(w) == 2}
    for b, row in enumerate(out.tolist()):
        end = stop_index(case, kw, row, width)
        for t in range(width, len(row) if end is None else end + 1):
            tok, k = row[t], t - width
            if tok in banned or (row[t - 1], tok) in pairs:
                return f"row {b}: banned token {tok} at new position {k}"
            if k < kw.get("min_new_tokens", 0) and tok in eos:
                return f"row {b}: EOS {tok} before min_new_tokens"
            if ex["user_processor"] and row[t - 1] == 2 and tok == 4:
                return f"row {b}: the user processor's banned token at new position {k}"
            if ex["prefix_fn"] and tok not in allowed_tokens(b, row[:t]):
                return f"row {b}: token {tok} not allowed by prefix_allowed_tokens_fn at new position {k}"
            if n_gram and t + 1 >= n_gram:
                gram = row[t + 1 - n_gram : t + 1]
                if any(row[s : s + n_gram] == gram for s in range(t + 1 - n_gram)):
                    return f"row {b}: repeated {n_gram}-gram at new position {k}"
        if end is None:
            if new != limit:
                return f"row {b} never stopped but the output has {new} of {limit} new tokens"
        elif eos and any(t != PAD for t in row[end + 1 :]):  # (without EOS ids generate() pads nothing)
            return f"row {b}: tokens after its stop at new position {end - width}"
    return None


def run_case(seed: int, index: int, fault: bool = False) -> tuple[str | None, dict, dict]:
    """-> (problem or None, the case, draft totals). Exceptions are problems too, unless plain
    generate() raises the same exception, type and message, on the same request."""
    case = draw_case(seed, index)
    totals = dict(drafted=0, accepted=0, rule_breaks=0)
    try:
        model = tiny_model(case["family"], case["model_seed"], case["window"])
        spec = NgramSpeculator(**case["settings"])
        # With shared history, an earlier request (the next prompt) fills it first.
        prompt_sets = [case["prompts"]]
        if case["settings"]["history_tokens"]:
            length = max(len(p) for p in case["prompts"])  # max_length and min_new_tokens still fit
            prompt_sets.insert(0, [make_prompt(np.random.default_rng([seed, index, 1]), length)])
        for rows in prompt_sets:
            problem = _compare(case, model, spec, rows, seed * 100_003 + index, fault, totals)
            if problem:
                return problem, case, totals
    except Exception as error:  # an exception is a mismatch too
        return _error_line(error), case, totals
    return None, case, totals


def error_mismatch(ours: Exception, plain: Exception) -> str | None:
    """None when the speculator failed as plain generate() did on the same request: the same
    exception type with the same message (the same condition raised it); else the problem."""
    if type(ours) is type(plain) and str(ours) == str(plain):
        return None
    return f"{_error_line(ours)}, but plain generate() raised {_error_line(plain)}"


def _error_line(error: Exception) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _compare(case: dict, model, spec, rows: list[list[int]], torch_seed: int, fault: bool, totals: dict):
    """One generate() call with the speculator, checked; -> a problem or None."""
    ids, mask = left_pad(rows, PAD)
    mask = mask if len(rows) > 1 else None  # one row: no mask, as callers pass it
    if case["extras"]["ones_mask"]:
        mask = torch.ones_like(ids)
    kw = generate_kwargs(case, ids, mask)
    torch.manual_seed(torch_seed)
    if case["extras"]["refused"]:
        return refused_problem(case, model, spec, rows, kw)
    batch = len(rows) * kw.get("num_return_sequences", 1)  # generate() expands before decoding
    if batch > 1 and not eos_ids(kw) and (kw.get("stopping_criteria") or kw.get("stop_strings")):
        # Refused too (ngramspec.hf.checks): with no EOS, plain generate() keeps writing tokens into
        # the rows a stop ends, which the speculator's loop cannot reproduce.
        from ngramspec import UnsupportedGenerationError

        try:
            model.generate(ids, ngram_speculator=spec, **kw)
        except UnsupportedGenerationError:
            return None
        return "a batch with stops but no EOS was not refused"
    try:
        with patched(case["extras"]["all_at_once"], fault):
            got = model.generate(ids, ngram_speculator=spec, **kw)
    except Exception as error:
        try:  # e.g. sampling from a row whose every token is banned: plain generate() fails alike
            torch.manual_seed(torch_seed)
            plain_generate(model, ids, **kw)
        except Exception as plain_error:
            return error_mismatch(error, plain_error)
        return _error_line(error) + " (plain generate() does not raise)"
    for s in spec.last_row_stats:
        totals["drafted"] += s.drafted_tokens
        totals["accepted"] += s.accepted_tokens
    sequences = got.sequences if case["extras"]["scores"] else got
    if kw["do_sample"]:  # sampled tokens differ from plain sampling's (module doc)
        torch.manual_seed(torch_seed)
        with patched(case["extras"]["all_at_once"], False), no_drafts():
            undrafted = model.generate(ids, ngram_speculator=spec, **kw)
        undrafted = undrafted.sequences if case["extras"]["scores"] else undrafted
        if sequences.tolist() != undrafted.tolist():
            return "seeded sampling differs from the same request decoded without drafts"
        return validity_problem(case, kw, ids, sequences)
    expected = plain_generate(model, ids, **kw)
    if case["extras"]["scores"]:
        problem = compare_scores(case, kw, got, expected, width=ids.shape[1])
        if problem:
            return problem
        expected = expected.sequences
    if sequences.tolist() != expected.tolist():
        first = next((j for j, (a, b) in enumerate(zip(sequences.flatten().tolist(), expected.flatten().tolist()))
                      if a != b), None)
        return (f"greedy sequences differ (shapes {tuple(sequences.shape)} vs {tuple(expected.shape)}, "
                f"first difference at flat index {first})")
    # The rules sampled output is held to, on plain greedy output: a check of the checker. Plain
    # generate() breaks one only where no token could keep it (e.g. every allowed token banned by
    # no_repeat_ngram_size); the count is printed, and should stay a small fraction.
    totals["rule_breaks"] += validity_problem(case, kw, ids, expected) is not None
    return None


def refused_problem(case: dict, model, spec, rows: list[list[int]], kw: dict) -> str | None:
    """The refused request must raise UnsupportedGenerationError (before decoding)."""
    from ngramspec import UnsupportedGenerationError

    name = case["extras"]["refused"]
    kw = {k: v for k, v in kw.items() if k not in ("logits_processor", "return_dict_in_generate", "output_scores",
                                                   "output_logits", "num_return_sequences")}
    if name == "cfg_in_batch" and len(rows) == 1:
        rows = rows * 2  # a batch, which is what this processor is refused for
        kw["attention_mask"] = None
    ids, _ = left_pad(rows, PAD)
    try:
        model.generate(ids, ngram_speculator=spec, **kw, **REFUSED[name]())
    except UnsupportedGenerationError:
        return None
    return f"the refused request {name} was not refused"


def compare_scores(case: dict, kw: dict, got, expected, width: int) -> str | None:
    """Scores and logits of the rows still running at each step equal plain generate()'s
    (a finished row's are plain's of its padding, the speculator's -inf but the pad)."""
    if len(got.scores) != len(expected.scores) or len(got.logits) != len(expected.logits):
        return f"{len(got.scores)} score steps vs {len(expected.scores)}"
    rows = expected.sequences.tolist()
    ends = [stop_index(case, kw, row, width) for row in rows]
    for name, ours_all, theirs_all in (("scores", got.scores, expected.scores), ("logits", got.logits,
                                                                                   expected.logits)):
        for i, (ours, theirs) in enumerate(zip(ours_all, theirs_all)):
            # A row runs at step i (choosing new token i) unless it stopped at an earlier one.
            live = [b for b in range(len(rows)) if ends[b] is None or ends[b] >= width + i]
            if live and not torch.allclose(ours[live], theirs[live].to(ours.dtype), rtol=SCORE_RTOL, atol=1e-9):
                return f"{name} differ at step {i}"
    return None


def describe(case: dict) -> str:
    s = case["settings"]
    settings = ",".join(f"{k}={v}" for k, v in s.items()).replace(" ", "")
    kw = ",".join(f"{k}={v}" for k, v in case["generate"].items()).replace(" ", "")
    ex = ",".join(f"{k}={v}" for k, v in case["extras"].items() if v not in (None, False)).replace(" ", "")
    window = f"/window{case['window']}" if case["family"] == "mistral" else ""
    return (f"family={case['family']}{window}/seed{case['model_seed']} path={case['path']} "
            f"prompt_lengths={[len(p) for p in case['prompts']]} generate={kw} extras={ex} settings={settings}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tests/fuzz.py",
        description="Differential fuzzing of ngramspec's generate() against transformers' own: random tiny "
                    "models, prompts with planted repeats, speculator settings and generation paths. Greedy "
                    "cases must match plain generate() token for token (and in scores); sampling cases must "
                    "produce valid output. Prints one reproduction line per mismatch, then "
                    "'N cases, M mismatches'; exits 1 if M > 0.")
    parser.add_argument("--cases", type=int, default=100, help="number of cases to run (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run; a case depends only on "
                                                            "(seed, case index) (default 0)")
    parser.add_argument("--case", type=int, default=None, metavar="K",
                        help="run only case K of this seed (to reproduce a mismatch)")
    parser.add_argument("--first", type=int, default=0, metavar="K",
                        help="run cases K .. K + cases - 1 (a share of a larger run; default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--inject-fault", action="store_true",
                        help="make the verifier keep the first rejected draft token of each case (a deliberate "
                             "bug), to check that the fuzzer catches it")
    parser.add_argument("--verbose", action="store_true", help="also print the description of every case")
    args = parser.parse_args(argv)
    if args.cases < 0 or args.first < 0:
        parser.error("--cases and --first must be >= 0")
    install()  # model.generate(ngram_speculator=...) below
    indices = [args.case] if args.case is not None else list(range(args.first, args.first + args.cases))
    from tqdm import tqdm

    mismatches, totals = 0, dict(drafted=0, accepted=0, rule_breaks=0)
    threads, verbosity = torch.get_num_threads(), hf_logging.get_verbosity()
    torch.set_num_threads(1)  # tiny models: threads only add overhead (both restored for callers)
    hf_logging.set_verbosity_error()  # plain generate()'s advice on masks and lengths
    try:
        for index in tqdm(indices, disable=args.quiet, file=sys.stderr, unit="case", smoothing=0):
            mismatches += _one(args, index, totals)
    finally:
        torch.set_num_threads(threads)
        hf_logging.set_verbosity(verbosity)
    print(f"drafted {totals['drafted']} tokens, accepted {totals['accepted']}; "
          f"{totals['rule_breaks']} plain greedy outputs broke a validity rule")
    print(f"{len(indices)} cases, {mismatches} mismatches", flush=True)
    return 1 if mismatches else 0


def _one(args, index: int, totals: dict) -> bool:
    """Run case ``index``, add to ``totals``; print its line if it mismatched; -> mismatched."""
    problem, case, counts = run_case(args.seed, index, fault=args.inject_fault)
    for key, value in counts.items():
        totals[key] += value
    if args.verbose:
        print(f"case {index}: {describe(case)}", flush=True)
    if problem:
        fault = " --inject-fault" if args.inject_fault else ""
        print(f"MISMATCH: python tests/fuzz.py --cases 1 --seed {args.seed} --case {index}{fault}  "
              f"# {problem.splitlines()[0]}; {describe(case)}", flush=True)
    return bool(problem)


if __name__ == "__main__":
    sys.exit(main())

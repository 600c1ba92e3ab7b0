"""`python -m eval compat`: every model type the installed transformers can load, one row each.

For every causal-LM type transformers registers (and every image-text-to-text type with no
causal-LM class, on a text-only prompt, and every encoder-decoder text-to-text type, its rows
named "TYPE (seq2seq)") a tiny random model is built from that type's own config
(``eval/tiny_models.py``) and decoded side by side:

- plain greedy ``generate()``, transformers' prompt lookup (``prompt_lookup_num_tokens=5``) and
  ngramspec (payoff sizing off, so that every match is drafted), on a prompt that repeats a
  stretch and then the model's own greedy continuation of it: drafts are accepted, partly
  rejected and rolled back. A row is identical only **with drafts verified**: the table shows
  the tokens drafted and accepted (MAT, and rollbacks: steps where part of a draft was rejected);
- seeded sampling: what is drafted never changes a seeded sample (drafts of up to 24 tokens give
  exactly the tokens of drafts of 1);
- a left-padded batch of 2 rows against plain batched greedy;
- the settings users pick, each against plain greedy with the same setting: a static, offloaded
  or quantized cache, sliding-window-only attention, eager/sdpa/flex attention, bfloat16 weights
  with eager attention (``bfloat16``: exact where every kernel rounds a row alike whatever the
  number of rows) and with sdpa attention (``bfloat16_sdpa``: its kernel rounds a forward over
  several tokens differently from one-token forwards, so a near-tie may part), and
  (``--compile``) a ``torch.compile``d forward. ngramspec warns every 16-bit greedy request
  (``InexactPrecisionWarning``); a ``DIFF`` after that warning ends in ``(warned)``.

Each cell is ``same`` (identical, drafts accepted), ``same, 0 acc`` (identical but no draft was
accepted: it proves nothing), ``DIFF`` (a different output: the one outcome that must never
happen), ``refused`` (ngramspec's own clear error before the first forward), ``CRASH`` (any
other exception), or ``n/a`` (plain decoding itself cannot run that setting). The table goes to
``--out`` (compat.md, compat.jsonl: one JSON line per type, so an interrupted run resumes).
"""

from __future__ import annotations

import json
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

from .compat_report import render, summary, update_readme
from .tiny_models import model_types, text_only_reason, tiny_model

NEW_TOKENS = 24
SETTINGS = ("static", "offloaded", "quantized", "sliding", "eager", "sdpa", "flex", "bfloat16", "bfloat16_sdpa")


def add_arguments(parser) -> None:
    parser.add_argument("--types", default="", help="comma-separated model types (default: every registered type)")
    parser.add_argument("--out", default="eval/results/compat", help="folder for compat.md and compat.jsonl")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"setting columns to run (default: all of {', '.join(SETTINGS)}; '' for none)")
    parser.add_argument("--compile", action="store_true", help="add the torch.compile column (slow on CPU)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per type before its row is cut short")
    parser.add_argument("--restart", action="store_true", help="ignore rows saved by an earlier run in --out")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's Supported models section from "
                        "the table (the full sweep's rows)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")


def main(args) -> int:
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    import ngramspec
    from ngramspec.hf.checks import UnsupportedGenerationError  # noqa: F401  (import check)

    ngramspec.install()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    causal, image_text, seq2seq = model_types()
    todo = [(t, "causal") for t in causal] + [(t, "image-text") for t in image_text] + [(t, "seq2seq") for t in seq2seq]
    if args.types:
        wanted = set(args.types.split(","))
        todo = [(t, kind) for t, kind in todo if t in wanted or row_name(t, kind) in wanted]
    settings = [s for s in args.settings.split(",") if s] + (["compile"] if args.compile else [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "compat.jsonl"
    if args.restart and log.exists():
        log.unlink()
    rows = {r["type"]: r for r in map(json.loads, log.open())} if log.exists() else {}
    for model_type, kind in tqdm(todo, desc="compat", unit="type", file=sys.stderr):
        name = row_name(model_type, kind)
        if name in rows:
            continue
        rows[name] = check_type(model_type, kind, settings, args.timeout)
        with log.open("a") as f:
            f.write(json.dumps(rows[name], default=str) + "\n")
    ordered = [rows[row_name(t, kind)] for t, kind in todo if row_name(t, kind) in rows]
    if not args.types:  # the log in the sweep's order, whatever order a resumed run appended rows in
        log.write_text("".join(json.dumps(row, default=str) + "\n" for row in ordered))
    import transformers

    (out / "compat.md").write_text(render(ordered, settings, transformers.__version__, args.command_line))
    print(summary(ordered))
    if args.readme:
        update_readme(ordered)
        print("README.md: Supported models section rewritten")
    return 0


# ---- one type -------------------------------------------------------------------------------

class _Timeout(Exception):
    pass


def row_name(model_type: str, kind: str) -> str:
    """A row's name: the type, and "(seq2seq)" after an encoder-decoder (BART has both)."""
    return f"{model_type} (seq2seq)" if kind == "seq2seq" else model_type


def check_type(model_type: str, kind: str, settings, timeout: int) -> dict:
    """One row of the table (see the module docstring for what each cell means); ``kind``:
    causal, image-text or seq2seq (:func:`eval.tiny_models.tiny_model`)."""
    row = {"type": row_name(model_type, kind), "kind": kind}

    def alarm(*_):
        raise _Timeout(f"over {timeout} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    start = time.perf_counter()
    try:
        _check(row, model_type, kind, settings)
    except _Timeout as err:
        row["cut_short"] = str(err)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _check(row: dict, model_type: str, kind: str, settings) -> None:
    try:
        model = tiny_model(model_type, kind=kind)
    except Exception as err:  # noqa: BLE001 - a type that cannot be built is a row, not a stop
        row["build"] = _error(err)
        return
    row["build"] = "ok"
    row["model"] = type(model).__name__
    reason = text_only_reason(model)
    if reason is not None:
        row["greedy"] = "n/a: " + reason
        return
    try:
        ids, batch = prompts(model)
    except _Timeout:
        raise
    except Exception as err:  # noqa: BLE001
        row["greedy"] = _error(err)
        return
    plain = _run(model, ids)
    row["greedy"] = "ok" if torch.is_tensor(plain) else plain
    if not torch.is_tensor(plain):
        return
    row["cache"] = cache_kind(model, ids)
    row["hf_pld"] = _compare(plain, _run(model, ids, prompt_lookup_num_tokens=5))
    row["ngramspec"], row["stats"] = _speculate(model, ids, plain)
    row["sampling"] = _sampling(model, ids)
    mask = batch[1]
    plain_batch = _run(model, batch[0], attention_mask=mask)
    if torch.is_tensor(plain_batch):
        row["batch2"] = _speculate(model, batch[0], plain_batch, attention_mask=mask)[0]
    else:
        row["batch2"] = "n/a"
    for setting in settings:
        row[setting] = _setting(model, model_type, kind, setting, ids)


def prompts(model, tries: int = 4) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """A single-row prompt (1, P) in which drafts are likely: a random stretch, repeated, then
    the model's own greedy continuation of it and the stretch again (so the model's next tokens
    were seen before, but not all of them: some drafts are cut short). Of ``tries`` random
    stretches, the one whose greedy output copies most from its prompt. And a left-padded batch
    of 2 rows, (ids, mask) of shape (2, P)."""
    vocab = getattr(model.config.get_text_config(decoder=True), "vocab_size", None) or 99
    special = _special_ids(model.config)
    allowed = torch.tensor([t for t in range(3, min(vocab, 99)) if t not in special])
    best, best_copied = None, -1
    for seed in range(tries):
        generator = torch.Generator().manual_seed(seed)
        stretch = allowed[torch.randint(len(allowed), (10,), generator=generator)]
        head = torch.cat([stretch, stretch, stretch[:5]])[None]
        own = _run(model, head, max_new_tokens=16)
        own = own[:, -16:] if torch.is_tensor(own) else stretch[None]  # (an encoder-decoder returns its output alone)
        ids = torch.cat([head, own, stretch[None], own[:, :3]], 1)
        out = _run(model, ids)
        copied = _copied(ids[0].tolist(), out[0, -NEW_TOKENS:].tolist()) if torch.is_tensor(out) else 0
        if copied > best_copied:
            best, best_copied = ids, copied
        if copied >= NEW_TOKENS // 2:
            break
    ids = best
    pad = _pad_id(model)
    short = ids[:, 4:]
    batch_ids = torch.cat([ids, torch.cat([torch.full((1, 4), pad), short], 1)])
    mask = torch.ones_like(batch_ids)
    mask[1, :4] = 0
    return ids, (batch_ids, mask)


def _copied(prompt: list[int], new: list[int]) -> int:
    """New tokens that continue a bigram seen before them: what a lookup draft could have given."""
    text, seen, copied = list(prompt), {(a, b) for a, b in zip(prompt, prompt[1:])}, 0
    for token in new:
        copied += (text[-1], token) in seen
        seen.add((text[-1], token))
        text.append(token)
    return copied


def _special_ids(config) -> set[int]:
    found = set()
    for source in [config] + [getattr(config, n) for n in getattr(config, "sub_configs", {}) if hasattr(config, n)]:
        for name, value in vars(source).items() if source is not None else ():
            if isinstance(value, int) and (name.endswith("token_id") or name.endswith("token_index")):
                found.add(value)
    return found


def _pad_id(model) -> int:
    pad = model.generation_config.pad_token_id
    return int(pad if pad is not None else 0)


def _run(model, ids, max_new_tokens: int = NEW_TOKENS, **kwargs):
    """generate() greedy, no EOS (a full-length output); a tensor, or the error as text. (Greedy
    also where the model's generation config asks for beam search, as FSMT's does.)"""
    kwargs.setdefault("do_sample", False)
    kwargs.setdefault("num_beams", 1)
    try:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                 pad_token_id=_pad_id(model), eos_token_id=None, **kwargs)
        # (batch, codebooks, length) from a multi-codebook decoder (MusicGen): back to its input's layout
        return out.reshape(-1, out.shape[-1]) if torch.is_tensor(out) and out.dim() == 3 else out
    except _Timeout:
        raise
    except Exception as err:  # noqa: BLE001
        return _error(err)


def _error(err: Exception) -> str:
    from ngramspec.hf.checks import UnsupportedGenerationError

    kind = "refused" if isinstance(err, UnsupportedGenerationError) else "CRASH"
    message = " ".join(str(err).split())[:160]
    return f"{kind}: {type(err).__name__}: {message}"


def _compare(reference, output) -> str:
    if not torch.is_tensor(output):
        return output
    return "same" if torch.equal(reference, output) else "DIFF"


def _speculate(model, ids, reference, **kwargs) -> tuple[str, dict]:
    from ngramspec import InexactPrecisionWarning, NgramSpeculator

    spec = NgramSpeculator(payoff_sizing=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InexactPrecisionWarning)
        output = _run(model, ids, ngram_speculator=spec, **kwargs)
    verdict = _compare(reference, output)
    if verdict == "DIFF" and reference.shape[0] == 1:
        verdict += _first_difference(model, ids.shape[1], reference, output)
    stats = {}
    if torch.is_tensor(output):
        s = spec.last_stats
        rollbacks = sum(a < d for a, d in zip(s.accepted_per_step, s.verified_per_step))
        stats = {"drafted": s.drafted_tokens, "accepted": s.accepted_tokens, "mat": round(s.mat, 2),
                 "rollbacks": rollbacks}
        if verdict == "same" and s.accepted_tokens == 0:
            verdict = "same, 0 acc"
    if verdict.startswith("DIFF") and any(issubclass(w.category, InexactPrecisionWarning) for w in caught):
        verdict += " (warned)"  # the user was told this setting may part at near-ties
    return verdict, stats


def _first_difference(model, prompt_len: int, reference, output) -> str:
    """Where the outputs part, and how close plain decoding's choice was there: the gap between
    the logits of its token and of ours, relative to its token's (a near-tie when it is within
    the dtype's rounding, which a forward over several tokens can flip)."""
    new_ref, new_out = reference[0, -NEW_TOKENS:].tolist(), output[0, -NEW_TOKENS:].tolist()
    i = next(j for j, (a, b) in enumerate(zip(new_ref, new_out)) if a != b)
    if model.config.is_encoder_decoder:
        return f" at new token {i}"
    with torch.no_grad():
        logits = model(input_ids=reference[:, : prompt_len + i]).logits[0, -1].float()
    gap = (logits[new_ref[i]] - logits[new_out[i]]).item() / max(logits[new_ref[i]].abs().item(), 1e-6)
    return f" at new token {i}, relative logit gap {gap:.1g}"


def _sampling(model, ids) -> str:
    """Seeded ngramspec sampling with long drafts gives the tokens of drafts of one token. (A tiny
    random model's logits are nearly flat: a low temperature among the top 3 keeps its samples
    varied yet close enough to its greedy text for drafts to be accepted.)"""
    from ngramspec import NgramSpeculator

    outputs, accepted = [], []
    for setting in (dict(), dict(max_draft_tokens=1)):
        spec = NgramSpeculator(payoff_sizing=False, **setting)
        torch.manual_seed(7)
        out = _run(model, ids, do_sample=True, temperature=0.02, top_k=3, ngram_speculator=spec)
        if not torch.is_tensor(out):
            return out
        outputs.append(out)
        accepted.append(spec.last_stats.accepted_tokens)
    if not torch.equal(*outputs):
        return "DIFF"
    return "same" if min(accepted) > 0 else "same, 0 acc"


def _setting(model, model_type: str, kind: str, setting: str, ids) -> str:
    """One settings column: plain greedy and ngramspec under the same setting."""
    kwargs = {}
    variant = model
    try:
        if setting in ("static", "offloaded"):
            kwargs = dict(cache_implementation=setting)
        elif setting == "quantized":
            kwargs = dict(cache_implementation="quantized", cache_config={"backend": "quanto", "nbits": 4})
        elif setting in ("eager", "sdpa", "flex"):
            variant = tiny_model(model_type, kind=kind,
                                 attn_implementation="flex_attention" if setting == "flex" else setting)
        elif setting in ("bfloat16", "bfloat16_sdpa"):  # eager (rare partings) and sdpa
            attention = "sdpa" if setting == "bfloat16_sdpa" else "eager"
            variant = tiny_model(model_type, kind=kind, dtype=torch.bfloat16, attn_implementation=attention)
        elif setting == "sliding":
            overrides = _sliding_only(model.config)
            if overrides is None:
                return "n/a"
            variant = tiny_model(model_type, kind=kind, **overrides)
        elif setting == "compile":
            variant = model
            variant.forward = torch.compile(model.forward, dynamic=True)
    except _Timeout:
        raise
    except Exception as err:  # noqa: BLE001
        return "n/a: " + _error(err)
    try:
        plain = _run(variant, ids, **kwargs)
        if not torch.is_tensor(plain):
            return "n/a: " + plain
        verdict = _speculate(variant, ids, plain, **kwargs)[0]
        if verdict.startswith("DIFF"):  # does transformers' own prompt lookup part there too?
            verdict += "; prompt lookup: " + _compare(plain, _run(variant, ids, prompt_lookup_num_tokens=5, **kwargs))
        return verdict
    finally:
        if setting == "compile":
            del model.forward  # back to the class's forward


def _sliding_only(config) -> dict | None:
    """Config overrides that make every attention layer a sliding window of 8 tokens (shorter
    than the prompt), or None where the type has no sliding window."""
    if not hasattr(config, "sliding_window"):
        return None
    overrides = {"sliding_window": 8}
    if hasattr(config, "use_sliding_window"):
        overrides["use_sliding_window"] = True
    types = getattr(config, "layer_types", None)
    if types is not None:
        overrides["layer_types"] = ["sliding_attention" if t == "full_attention" else t for t in types]
    return overrides


def cache_kind(model, ids) -> str:
    """The cache generate() gives this model: its layer classes, in short."""
    try:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=1, do_sample=False, return_dict_in_generate=True,
                                 pad_token_id=_pad_id(model))
    except Exception:  # noqa: BLE001
        return "?"
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:
        return "none"
    layers = getattr(cache, "layers", None)
    if layers is None:
        return type(cache).__name__
    names = sorted({type(layer).__name__.replace("Layer", "") for layer in layers})
    return "+".join(names)

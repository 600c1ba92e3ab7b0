"""Exactness on the real default model (SmolLM2-135M-Instruct, fp32, CPU) over 20 shared items.

ngramspec greedy output must equal plain greedy ``generate`` token for token, exactly.

How equality is established cheaply: plain greedy decoding picks, at every position, the top
logit of a one-token forward over the cached prefix. One forward over prompt + ngramspec's
output gives the logits of every position at once; on a CPU in fp32 they differ from the
cached one-token logits by up to ~1e-4 (``test_the_long_prompt_is_exact_and_one_forward_agrees_with_decoding``
measures the gap on a long prompt in every run and requires it below MARGIN / 10). So where every new
token is that forward's top logit, leading the runner-up by at least MARGIN, and the output
ends where plain decoding ends (an end-of-sequence token last and nowhere earlier, or
max_new_tokens), plain greedy ``generate`` produces exactly these tokens: the output is
*certified*. Any position that is not certified, a near-tie or a mismatch, falls back to
running plain greedy ``generate`` and comparing token for token, and a difference fails with
the position, both tokens and the plain model's logit gap there.
"""

import pytest
import torch

import tasks
from ngramspec import NgramSpeculator, load_model
from ngramspec.cost.curves import DEFAULT_CPU_CURVE

from conftest import plain_generate

MAX_NEW_TOKENS = 48
MARGIN = 1e-2  # logit lead that certifies a greedy choice (the gap measured at 2.4k tokens: 6e-5)
# 20 items: 7 rewriting, 7 code editing, 6 summarization, the first of each set (qmsum's is a
# 2.4k-token prompt; the 100-item benchmarks in eval/results/ compare every output with greedy).
ITEMS = {
    "jfleg": 2, "asset": 2, "iterater_human": 3,
    "humanevalfix": 3, "quixbugs": 2, "editeval_instructcoder": 2,
    "spec_bench_cnndm": 2, "xsum": 2, "dialogsum": 1, "qmsum_specific": 1,
}
# The long prompt is checked by test_the_long_prompt_is_exact_and_one_forward_agrees_with_decoding,
# which also measures the certificate's premise on it (one prefill of 2.4k tokens saved).
LONG_ITEM = "qmsum_specific"

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not (tasks.default_data_dir() / "jfleg").is_dir(),
        reason=f"shared evaluation data not found at {tasks.default_data_dir()} (set NGRAMSPEC_DATA)",
    ),
]


@pytest.fixture(scope="session")
def default_model():
    torch.manual_seed(0)
    return load_model()


def item_prompt(tokenizer, name: str, index: int) -> list[int]:
    return tasks.prompt_ids(tokenizer, tasks.load_items(name, limit=index + 1)[index])


def one_forward_logits(model, prompt: list[int], new: list[int]) -> torch.Tensor:
    """Logits (len(new), V) that predict each token of ``new``, from one forward over prompt + new."""
    with torch.no_grad():
        return model(torch.tensor([prompt + new[:-1]]), logits_to_keep=len(new)).logits[0].float()


def plain_tokens_needed(model, prompt: list[int], new: list[int], max_new_tokens: int,
                        logits: torch.Tensor | None = None) -> int:
    """How many leading tokens of ``new`` a plain greedy run must confirm: 0 when one forward
    over ``prompt + new`` certifies every position (see the module docstring); else up to the
    last position it does not certify (a near-tie or a mismatch), as every later position is
    certified given that prefix; max_new_tokens when where the output ends is not certified."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if logits is None:
        logits = one_forward_logits(model, prompt, new)
    top = logits.topk(2, dim=-1)  # values, indices: (len(new), 2)
    lead = top.values[:, 0] - top.values[:, 1]
    doubtful = [j for j, token in enumerate(new) if token != int(top.indices[j, 0]) or float(lead[j]) < MARGIN]
    if any(token in eos for token in new[:-1]) or (len(new) < max_new_tokens and new[-1] not in eos):
        return max_new_tokens  # plain decoding would stop elsewhere
    return doubtful[-1] + 1 if doubtful else 0


def assert_plain_greedy(model, prompt: list[int], ours: list[int], max_new_tokens: int, what: str,
                        logits: torch.Tensor | None = None) -> int:
    """``ours`` equals plain greedy ``generate``'s new tokens: certified by one forward (``logits``
    when already computed), where needed confirmed by a plain greedy run. Returns how many tokens
    that plain run made."""
    needed = plain_tokens_needed(model, prompt, ours, max_new_tokens, logits)
    if needed:
        plain = plain_generate(model, torch.tensor([prompt]), max_new_tokens=needed, do_sample=False)
        assert_identical(model, prompt, plain[0, len(prompt) :].tolist(), ours[:needed], what)
    return needed


def assert_identical(model, prompt, plain, ours, what):
    """``ours == plain`` (new-token lists); otherwise fail naming the first difference and the
    plain model's logit gap between the two tokens there (recomputed without padding)."""
    if ours == plain:
        return
    i = next((j for j, (a, b) in enumerate(zip(plain, ours)) if a != b), min(len(plain), len(ours)))
    if i == len(plain) or i == len(ours):
        raise AssertionError(f"{what}: same first {i} new tokens, then plain stops after {len(plain)} "
                             f"and ngramspec after {len(ours)}")
    with torch.no_grad():
        logits = model(torch.tensor([prompt + plain[:i]]), logits_to_keep=1).logits[0, -1].float()
    gap = float(logits[plain[i]] - logits[ours[i]])
    raise AssertionError(f"{what}: outputs differ at new token {i} (plain {plain[i]}, ngramspec {ours[i]}; "
                         f"plain logit gap {gap:.3g})")


@pytest.mark.parametrize("name", [name for name in ITEMS if name != LONG_ITEM])
def test_greedy_identical_on_shared_items(default_model, name):
    """Every item of the set (one test per set, so parallel workers share them out), with
    drafts accepted in the set: the items exercise verification, not only plain steps. Drafts
    are sized by the fixed CPU curve, not by timings: a machine busy with other tests would
    decline drafts on these short outputs and leave verification unexercised."""
    model, tokenizer = default_model
    spec = NgramSpeculator(verify_cost=DEFAULT_CPU_CURVE.points)
    accepted = 0
    for index in range(ITEMS[name]):
        prompt = item_prompt(tokenizer, name, index)
        ours = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                              ngram_speculator=spec)[0, len(prompt) :].tolist()
        confirmed = assert_plain_greedy(model, prompt, ours, MAX_NEW_TOKENS, f"{name}/{index}")
        stats = spec.last_stats
        accepted += stats.accepted_tokens
        print(f"\n{name}/{index}: {len(prompt)}-token prompt, {stats.new_tokens} new tokens ({confirmed} also by a "
              f"plain run), {stats.accepted_tokens} accepted, MAT {stats.new_tokens / stats.target_forwards:.2f}")
    assert accepted > 0, f"no draft token of {name} was accepted: the set would not exercise verification"


def test_the_long_prompt_is_exact_and_one_forward_agrees_with_decoding(default_model):
    """The long item (2.4k tokens) as every item above, and the certificate's premise checked
    where it is used: the logits of the one forward over its prompt + ngramspec's output differ
    from plain decoding's cached one-token logits by less than MARGIN / 10 at the first 16
    positions (plain decoding's tokens there are ngramspec's, compared directly)."""
    model, tokenizer = default_model
    prompt = item_prompt(tokenizer, LONG_ITEM, 0)
    spec = NgramSpeculator()
    ours = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                          ngram_speculator=spec)[0, len(prompt) :].tolist()
    logits = one_forward_logits(model, prompt, ours)
    plain = plain_generate(model, torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                           return_dict_in_generate=True, output_logits=True)
    new = plain.sequences[0, len(prompt) :].tolist()
    assert_identical(model, prompt, new, ours[: len(new)], f"{LONG_ITEM}/0")
    cached = torch.cat(plain.logits).float()  # (16, vocab)
    gap = float((logits[: len(new)] - cached).abs().max())
    print(f"\none forward vs cached decoding, {len(prompt)}-token prompt: max logit gap {gap:.2g}")
    assert len(prompt) > 1000 and gap < MARGIN / 10
    assert_plain_greedy(model, prompt, ours, MAX_NEW_TOKENS, f"{LONG_ITEM}/0", logits)
    assert spec.last_stats.accepted_tokens > 0, "no draft token of the long item was accepted"


def test_stop_string_inside_accepted_draft(default_model):
    model, tokenizer = default_model
    prompt = item_prompt(tokenizer, "quixbugs", 0)
    ids = torch.tensor([prompt])
    full = model.generate(ids, max_new_tokens=64, do_sample=False, ngram_speculator=NgramSpeculator())
    full = full[0, len(prompt) :].tolist()
    assert_plain_greedy(model, prompt, full, 64, "quixbugs without a stop string")
    text = tokenizer.decode(full)
    stop = text[len(text) // 2 : len(text) // 2 + 5]  # a string that first ends mid-output
    assert stop.strip(), "pick a non-blank stop string"
    kwargs = dict(max_new_tokens=64, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    expected = plain_generate(model, ids, **kwargs)
    spec = NgramSpeculator()
    got = model.generate(ids, ngram_speculator=spec, **kwargs)
    assert got.tolist() == expected.tolist()
    assert expected.shape[1] - ids.shape[1] < len(full) and spec.last_stats.stop_reason == "criteria"


def test_text_streamers_stream_exactly_the_returned_text(default_model, capsys):
    from threading import Thread

    from transformers import TextIteratorStreamer, TextStreamer

    model, tokenizer = default_model
    item = tasks.load_items("iterater_human", limit=1)[0]
    ids = torch.tensor([tasks.prompt_ids(tokenizer, item)])
    spec = NgramSpeculator()

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    result = {}
    worker = Thread(target=lambda: result.update(out=model.generate(
        ids, max_new_tokens=48, ngram_speculator=spec, streamer=streamer)))
    worker.start()
    chunks = list(streamer)
    worker.join()
    expected_text = tokenizer.decode(result["out"][0, ids.shape[1] :], skip_special_tokens=True)
    assert "".join(chunks) == expected_text and len(chunks) > 1
    assert spec.last_stats.accepted_tokens > 0  # drafts arrived as multi-token chunks

    capsys.readouterr()
    out = model.generate(ids, max_new_tokens=48, ngram_speculator=spec,
                         streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    printed = capsys.readouterr().out
    assert printed.rstrip("\n") == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).rstrip("\n")


def test_batch_with_stop_strings_equals_plain_batch(default_model):
    """A left-padded batch of 4 shared items (mixed prompt lengths) with a stop string that
    ends one row early: each row equals plain batched greedy (exactly, as above), and rows
    really accept different amounts."""
    model, tokenizer = default_model
    items = [tasks.load_items(n, limit=1)[0] for n in ("jfleg", "quixbugs", "asset", "humanevalfix")]
    prompts = [tasks.prompt_ids(tokenizer, item) for item in items]
    pad = tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    first_row = plain_generate(model, ids[:1, width - len(prompts[0]):], max_new_tokens=12)[0, len(prompts[0]):]
    stop = tokenizer.decode(first_row)[10:14]  # ends row 0 after a few tokens
    assert len(stop) == 4
    kwargs = dict(attention_mask=mask, max_new_tokens=64, do_sample=False, pad_token_id=pad,
                  stop_strings=[stop], tokenizer=tokenizer)
    plain = plain_generate(model, ids, **kwargs)[:, width:].tolist()
    spec = NgramSpeculator()
    ours = model.generate(ids, ngram_speculator=spec, **kwargs)[:, width:].tolist()
    assert spec.last_row_stats[0].stop_reason == "criteria" and spec.last_row_stats[0].new_tokens < 20
    for b, (p_row, o_row) in enumerate(zip(plain, ours)):
        assert_identical(model, prompts[b], p_row, o_row, f"batch row {b}")
    assert sum(s.accepted_tokens for s in spec.last_row_stats) > 20


@pytest.mark.parametrize("names", [("jfleg", "asset", "quixbugs", "humanevalfix"), ("xsum", "dialogsum")])
def test_token_trees_equal_plain_greedy(default_model, monkeypatch, names):
    """Token trees (3 candidate continuations per pass, a 4D mask and explicit positions,
    the cache compacted to the accepted path) on 6 shared items x 64 tokens, in two groups
    that each accept a path off the first branch: identical to plain greedy (certified or
    compared, as above)."""
    from ngramspec.hf.target import HFTarget

    model, tokenizer = default_model
    spec = NgramSpeculator(tree_branches=3, verify_cost=((1, 1.0), (32, 1.0)))
    tree_steps, paths, original = 0, [], HFTarget.gather

    def recording(self, rows, columns):  # a batch of one gathers columns only for a tree path
        paths.append(columns)
        return original(self, rows, columns)

    monkeypatch.setattr(HFTarget, "gather", recording)
    for name in names:
        prompt = item_prompt(tokenizer, name, 0)
        ours = model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False,
                              ngram_speculator=spec)[0, len(prompt) :].tolist()
        assert_plain_greedy(model, prompt, ours, 64, f"tree decoding of {name}")
        tree_steps += spec.last_stats.steps_with_draft
    assert tree_steps > 15 and paths, "trees were not exercised: few drafted steps, or no non-first branch taken"
    print(f"\ntrees: {tree_steps} drafted steps, {len(paths)} accepted a non-first branch")
    assert paths, "no step accepted a path off the first branch: compaction untested here"

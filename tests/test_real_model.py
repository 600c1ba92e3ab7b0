"""Exactness on the real default model (SmolLM2-135M-Instruct, fp32, CPU) over 20 shared items.

ngramspec greedy output must equal plain greedy ``generate`` token for token, exactly. On a CPU
in fp32 a forward over k+1 tokens and k+1 one-token forwards differ by ~1e-5 in the logits, so
a genuine near-tie (top two logits closer than that) could flip a token; none occurs on these
items and settings, so any difference fails. The failure message gives the position, both
tokens and the plain model's logit gap there: a gap of ~1e-5 means such a tie (choose other
items), anything larger a bug.
"""

import pytest
import torch

import tasks
from ngramspec import NgramSpeculator, load_model

from conftest import plain_generate

MAX_NEW_TOKENS = 128
# 20 items: 7 rewriting, 7 code editing, 6 summarization (first items of each set; the
# 100-item benchmarks in eval/results/ compare every output with greedy as well).
ITEMS = {
    "jfleg": 2, "asset": 2, "iterater_human": 3,
    "humanevalfix": 3, "quixbugs": 2, "editeval_instructcoder": 2,
    "spec_bench_cnndm": 2, "xsum": 2, "dialogsum": 1, "qmsum_specific": 1,
}

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not (tasks.default_data_dir() / "jfleg").is_dir(),
        reason=f"shared evaluation data not found at {tasks.default_data_dir()} (set NGRAMSPEC_DATA)",
    ),
]


@pytest.fixture(scope="module")
def default_model():
    torch.manual_seed(0)
    return load_model()


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


def test_greedy_identical_on_shared_items(default_model):
    model, tokenizer = default_model
    spec = NgramSpeculator()
    accepted, total_new, forwards = 0, 0, 0
    for name, count in ITEMS.items():
        for item in tasks.load_items(name, limit=count):
            prompt = tasks.prompt_ids(tokenizer, item)
            ids = torch.tensor([prompt])
            plain = plain_generate(model, ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            plain = plain[0, len(prompt) :].tolist()
            ours = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, ngram_speculator=spec)
            ours = ours[0, len(prompt) :].tolist()
            accepted += spec.last_stats.accepted_tokens
            total_new += spec.last_stats.new_tokens
            forwards += spec.last_stats.target_forwards
            assert_identical(model, prompt, plain, ours, f"{name}/{item['id']}")
    assert accepted > 200, "drafts were barely used: the test would not exercise verification"
    print(f"\nreal model: {sum(ITEMS.values())} items, {total_new} tokens, MAT {total_new / forwards:.2f}")


def test_stop_string_inside_accepted_draft(default_model):
    model, tokenizer = default_model
    item = tasks.load_items("quixbugs", limit=1)[0]
    ids = torch.tensor([tasks.prompt_ids(tokenizer, item)])
    full = plain_generate(model, ids, max_new_tokens=96, do_sample=False)[0, ids.shape[1] :]
    text = tokenizer.decode(full)
    stop = text[len(text) // 2 : len(text) // 2 + 5]  # a string that first ends mid-output
    assert stop.strip(), "pick a non-blank stop string"
    kwargs = dict(max_new_tokens=96, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
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
        ids, max_new_tokens=96, ngram_speculator=spec, streamer=streamer)))
    worker.start()
    chunks = list(streamer)
    worker.join()
    expected_text = tokenizer.decode(result["out"][0, ids.shape[1] :], skip_special_tokens=True)
    assert "".join(chunks) == expected_text and len(chunks) > 1
    assert spec.last_stats.accepted_tokens > 0  # drafts arrived as multi-token chunks

    capsys.readouterr()
    out = model.generate(ids, max_new_tokens=96, ngram_speculator=spec,
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
    first_row = plain_generate(model, ids[:1, width - len(prompts[0]):], max_new_tokens=64)[0, len(prompts[0]):]
    stop = tokenizer.decode(first_row)[10:14]  # ends row 0 after a few tokens
    kwargs = dict(attention_mask=mask, max_new_tokens=64, do_sample=False, pad_token_id=pad,
                  stop_strings=[stop], tokenizer=tokenizer)
    plain = plain_generate(model, ids, **kwargs)[:, width:].tolist()
    spec = NgramSpeculator()
    ours = model.generate(ids, ngram_speculator=spec, **kwargs)[:, width:].tolist()
    assert spec.last_row_stats[0].stop_reason == "criteria" and spec.last_row_stats[0].new_tokens < 20
    for b, (p_row, o_row) in enumerate(zip(plain, ours)):
        assert_identical(model, prompts[b], p_row, o_row, f"batch row {b}")
    assert sum(s.accepted_tokens for s in spec.last_row_stats) > 20


def test_token_trees_equal_plain_greedy(default_model):
    """Token trees (3 candidate continuations per pass, a 4D mask and explicit positions,
    the cache compacted to the accepted path) on 6 shared items x 96 tokens: identical to
    plain greedy (exactly, as above)."""
    from ngramspec.hf import HFTarget

    model, tokenizer = default_model
    spec = NgramSpeculator(tree_branches=3, verify_cost=((1, 1.0), (32, 1.0)))
    tree_steps, paths, original = 0, [], HFTarget.gather

    def recording(self, rows, columns):  # a batch of one gathers columns only for a tree path
        paths.append(columns)
        return original(self, rows, columns)

    HFTarget.gather = recording
    for name in ("jfleg", "asset", "quixbugs", "humanevalfix", "xsum", "dialogsum"):
        item = tasks.load_items(name, limit=1)[0]
        prompt = tasks.prompt_ids(tokenizer, item)
        ids = torch.tensor([prompt])
        plain = plain_generate(model, ids, max_new_tokens=96, do_sample=False)[0, len(prompt) :].tolist()
        ours = model.generate(ids, max_new_tokens=96, do_sample=False, ngram_speculator=spec)[0, len(prompt) :].tolist()
        assert_identical(model, prompt, plain, ours, f"tree decoding of {name}")
        tree_steps += spec.last_stats.steps_with_draft
    HFTarget.gather = original
    assert tree_steps > 30
    print(f"\ntrees: {tree_steps} drafted steps, {len(paths)} accepted a non-first branch")
    assert paths, "no step accepted a path off the first branch: compaction untested here"

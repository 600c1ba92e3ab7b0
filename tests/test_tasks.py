"""The evaluation sets (tasks/): loading from the shared data, prompts, ordering, scoring."""

import json

import pytest

import tasks
from ngramspec import models
from tasks import base, humanevalfix, scoring

DATA = tasks.default_data_dir()

pytestmark = pytest.mark.skipif(
    not (DATA / "jfleg").is_dir(),
    reason=f"shared evaluation data not found at {DATA} (set NGRAMSPEC_DATA)",
)

EXPECTED = {  # name -> (family, file, item count, extra fields every item has)
    "spec_bench_cnndm": ("summarization", "spec_bench/spec_bench_cnndm_summarization.jsonl", 80, {"turns"}),
    "xsum": ("summarization", "xsum/xsum.jsonl", 1000, set()),
    "dialogsum": ("summarization", "dialogsum/dialogsum.jsonl", 500, {"topics"}),
    "qmsum_specific": ("summarization", "qmsum_specific/qmsum_specific.jsonl", 244, {"relevant_text_span"}),
    "jfleg": ("rewriting", "jfleg/jfleg.jsonl", 747, set()),
    "asset": ("rewriting", "asset/asset.jsonl", 359, set()),
    "iterater_human": ("rewriting", "iterater_human/iterater_human.jsonl", 415, {"doc_id", "revision_depth"}),
    "humanevalfix": ("code_editing", "humanevalfix/humanevalfix.jsonl", 984, {"language", "test", "entry_point"}),
    "quixbugs": ("code_editing", "quixbugs/quixbugs.jsonl", 80, {"language", "program"}),
    "editeval_instructcoder": ("code_editing", "editeval_instructcoder/editeval_instructcoder.jsonl", 194, {"test"}),
}
NAMES = list(EXPECTED)


def raw_lines(name):
    """The set's file parsed line by line with json, independently of datasets."""
    with open(DATA / EXPECTED[name][1], encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# --- registry --------------------------------------------------------------------------------


def test_registry_names_families_and_files():
    assert list(tasks.TASKS) == NAMES
    assert tasks.FILES == {name: file for name, (_, file, _, _) in EXPECTED.items()}
    assert tasks.FAMILIES == {
        "summarization": ("spec_bench_cnndm", "xsum", "dialogsum", "qmsum_specific"),
        "rewriting": ("jfleg", "asset", "iterater_human"),
        "code_editing": ("humanevalfix", "quixbugs", "editeval_instructcoder"),
    }
    for name, (family, _, _, _) in EXPECTED.items():
        assert tasks.family_of(name) == family == tasks.TASKS[name].family
        assert tasks.TASKS[name].metrics == scoring.METRICS[family]


def test_unknown_set_is_a_key_error():
    with pytest.raises(KeyError, match="unknown set 'nope'"):
        tasks.load_items("nope")
    with pytest.raises(KeyError, match="unknown set"):
        tasks.family_of("nope")


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_items_are_the_file_lines_in_order(name):
    items = tasks.TASKS[name].items()
    raw = raw_lines(name)
    assert len(items) == len(raw) == EXPECTED[name][2]
    for item, line in zip(items, raw):
        assert {k: item[k] for k in line} == line
        # datasets' union schema: fields other lines have are present as None
        assert all(item[k] is None for k in set(item) - set(line))


@pytest.mark.parametrize("name", NAMES)
def test_items_have_the_schema(name):
    items = tasks.load_items(name)
    extras = EXPECTED[name][3]
    assert len({item["id"] for item in items}) == len(items)
    for item in items:
        assert isinstance(item["id"], str) and isinstance(item["task"], str)
        assert isinstance(item["source"], str) and item["source"].strip()
        assert isinstance(item["instruction"], str) and item["instruction"].strip()
        assert item["references"] and all(isinstance(ref, str) for ref in item["references"])
        assert all(item[field] is not None for field in extras), item["id"]


@pytest.mark.parametrize("name", NAMES)
def test_limit_takes_the_first_items_of_the_order(name):
    everything = tasks.load_items(name)
    assert tasks.load_items(name, limit=3) == everything[:3]
    assert tasks.load_items(name, limit=0) == []
    assert tasks.load_items(name, limit=10_000) == everything


def test_limit_follows_file_order_outside_humanevalfix():
    assert [i["id"] for i in tasks.load_items("quixbugs", limit=2)] == [
        "quixbugs-python-bitcount", "quixbugs-python-breadth_first_search",
    ]
    with pytest.raises(ValueError, match="limit"):
        tasks.load_items("jfleg", limit=-1)


def test_loaded_items_are_copies():
    first = tasks.load_items("jfleg", limit=1)[0]
    first["source"] = "changed"
    first["references"].append("changed")
    again = tasks.load_items("jfleg", limit=1)[0]
    assert again["source"] != "changed" and "changed" not in again["references"]


def test_explicit_data_dir_and_environment(tmp_path, monkeypatch):
    line = {"id": "x-0", "task": "t", "source": "a b", "instruction": "Fix:", "references": ["a c"]}
    (tmp_path / "jfleg").mkdir()
    (tmp_path / "jfleg" / "jfleg.jsonl").write_text(json.dumps(line) + "\n")
    assert tasks.load_items("jfleg", data_dir=tmp_path) == [line]
    monkeypatch.setenv("NGRAMSPEC_DATA", str(tmp_path))
    assert tasks.default_data_dir() == tmp_path
    assert tasks.load_items("jfleg") == [line]


def test_missing_file_names_the_ways_to_give_the_data(tmp_path, monkeypatch):
    monkeypatch.delenv("NGRAMSPEC_USE_HUB", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        tasks.load_items("jfleg", data_dir=tmp_path)
    message = str(err.value)
    assert str(tmp_path / "jfleg" / "jfleg.jsonl") in message
    assert "--data-dir" in message and "NGRAMSPEC_DATA" in message
    assert "NGRAMSPEC_USE_HUB=1" in message and "jhu-clsp/jfleg" in message
    with pytest.raises(FileNotFoundError) as err:  # a set without a hub copy offers no hub
        tasks.load_items("qmsum_specific", data_dir=tmp_path)
    assert "--data-dir" in str(err.value) and "NGRAMSPEC_USE_HUB" not in str(err.value)


# --- humanevalfix ordering -------------------------------------------------------------------


def test_humanevalfix_interleaves_languages():
    ids = [item["id"] for item in tasks.load_items("humanevalfix", limit=12)]
    assert ids == [f"{lang}-{k}" for k in (0, 1) for lang in ("Python", "JavaScript", "Java", "Go", "CPP", "Rust")]
    everything = tasks.load_items("humanevalfix")
    assert sorted(i["id"] for i in everything) == sorted(line["id"] for line in raw_lines("humanevalfix"))


def test_humanevalfix_language_filter():
    task = tasks.TASKS["humanevalfix"]
    items = task.load(limit=4, languages=("rust", "python"))
    assert [i["id"] for i in items] == ["Rust-0", "Python-0", "Rust-1", "Python-1"]
    assert len(task.load(languages=("go",))) == 164
    with pytest.raises(ValueError, match="unknown language"):
        task.load(languages=("cobol",))


def test_interleave_handles_uneven_groups():
    items = [{"id": i, "language": lang} for i, lang in enumerate(["python"] * 3 + ["js"])]
    assert [i["id"] for i in humanevalfix.interleave(items, ("python", "js"))] == [0, 3, 1, 2]


# --- prompts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_messages_are_instruction_blank_line_source(name):
    item = tasks.load_items(name, limit=1)[0]
    assert tasks.TASKS[name].messages(item) == [
        {"role": "user", "content": item["instruction"] + "\n\n" + item["source"]}
    ]


class FakeTokenizer:
    """Records the chat-template call and answers like a transformers tokenizer with return_dict."""

    def apply_chat_template(self, messages, **kwargs):
        self.call = (messages, kwargs)
        return {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}


def test_prompt_ids_uses_the_chat_template_with_generation_prompt():
    item = {"instruction": "Fix:", "source": "x = 1", "id": "i", "task": "t", "references": []}
    tokenizer = FakeTokenizer()
    assert tasks.prompt_ids(tokenizer, item) == [5, 6, 7]
    messages, kwargs = tokenizer.call
    assert messages == [{"role": "user", "content": "Fix:\n\nx = 1"}]
    assert kwargs == {"add_generation_prompt": True, "return_dict": True}


def converted_default_tokenizer():
    """The default model's tokenizer (converts the model once, ~25 s, if not cached yet)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.default_model_dir())


@pytest.mark.real_model
def test_prompt_ids_with_the_default_tokenizer():
    tokenizer = converted_default_tokenizer()
    item = tasks.load_items("quixbugs", limit=1)[0]
    ids = tasks.prompt_ids(tokenizer, item)
    assert ids and all(isinstance(i, int) for i in ids)
    text = tokenizer.decode(ids)
    assert f"<|im_start|>user\n{item['instruction']}\n\n{item['source']}<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


# --- hub mapping (the download itself cannot run offline) -------------------------------------


def test_hub_rows_map_onto_the_schema():
    row = {"declaration": "def f():\n", "buggy_solution": "    return 1\n",
           "canonical_solution": "    return 2\n", "entry_point": "f"}
    item = humanevalfix.TASK.hub.to_item(row, "humanevalfix", "go", 7)
    assert item["id"] == "humanevalfix-go-7" and item["language"] == "go" and item["task"] == "humanevalfix"
    assert item["source"] == "def f():\n    return 1\n"
    assert item["references"] == ["def f():\n    return 2\n"]
    assert item["instruction"] == "Fix bugs in f." and item["entry_point"] == "f"
    jfleg_item = tasks.TASKS["jfleg"].hub.to_item({"sentence": "a", "corrections": ["b", "c"]}, "jfleg", None, 0)
    assert (jfleg_item["id"], jfleg_item["source"], jfleg_item["references"]) == ("jfleg-0", "a", ["b", "c"])


# --- scoring ---------------------------------------------------------------------------------


def test_rouge_l_hand_computed():
    # LCS 3 words; precision 3/3, recall 3/6 -> F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    assert scoring.rouge_l("the cat sat", ["the cat sat on the mat"]) == pytest.approx(2 / 3)
    # "a b c d" vs "a x c": LCS 2, F1 4/7; vs "b c d e": LCS 3, F1 3/4 -> the maximum
    assert scoring.rouge_l("a b c d", ["a x c", "b c d e"]) == pytest.approx(0.75)
    assert scoring.rouge_l("The CAT, sat!", "the cat sat") == 1.0  # case and punctuation ignored
    assert scoring.rouge_l("same words here", ["same words here"]) == 1.0
    assert scoring.rouge_l("alpha beta", ["gamma delta"]) == 0.0
    assert scoring.rouge_l("", ["the cat"]) == 0.0
    assert scoring.rouge_l("the cat", []) == 0.0


def test_similarity_and_edit_similarity():
    assert scoring.similarity("abc", "abc") == 1.0
    assert scoring.similarity("abc", "xyz") == 0.0
    assert scoring.similarity("abcd", "abce") == pytest.approx(0.75)  # indel distance 2 over 8 chars
    assert scoring.edit_similarity("kitten", "sitting") == pytest.approx(4 / 7)  # 3 edits, longer has 7
    assert scoring.edit_similarity("same", "same") == 1.0


def test_extract_code():
    assert scoring.extract_code("Here:\n```python\nx = 1\n```\nDone.") == "x = 1\n"
    assert scoring.extract_code("```\nfirst\n```\n```\nsecond\n```") == "first\n"
    assert scoring.extract_code("x = 1\ny = 2") == "x = 1\ny = 2"
    assert scoring.extract_code("```go\nfunc f() {\n") == "func f() {\n"  # cut off before the closing fence


def test_exact_match_ignores_trailing_whitespace_only():
    assert scoring.exact_match("def f():  \n    return 1\n\n", "\ndef f():\n    return 1") == 1.0
    assert scoring.exact_match("def f():\n  return 1", "def f():\n    return 1") == 0.0


def test_family_scores():
    summary = {"source": "long text", "references": ["the cat sat on the mat"]}
    assert scoring.score("summarization", "the cat sat", summary) == {"rougeL": pytest.approx(2 / 3)}
    assert scoring.score("summarization", "the cat sat", {**summary, "references": []}) == {}

    rewrite = {"source": "abcd", "references": ["xyz", "abce"]}
    assert scoring.score("rewriting", " abcd\n", rewrite) == {"ref_similarity": 0.75, "src_similarity": 1.0}
    assert scoring.score("rewriting", "abcd", {**rewrite, "references": []}) == {"src_similarity": 1.0}

    code = {"source": "x = 0\n", "references": ["y = 2\n", "x = 1\n"]}
    assert scoring.score("code_editing", "Fixed:\n```python\nx = 1\n```", code) == {
        "exact_match": 1.0, "edit_similarity": 1.0,
    }
    scores = scoring.score("code_editing", "x = 2", code)
    assert scores == {"exact_match": 0.0, "edit_similarity": pytest.approx(0.8)}  # one edit in five chars
    assert scoring.score("code_editing", "x = 1", {**code, "references": []}) == {}


@pytest.mark.parametrize("name", NAMES)
def test_a_reference_output_scores_perfectly(name):
    task = tasks.TASKS[name]
    item = task.load(limit=1)[0]
    scores = task.score(item["references"][0], item)
    assert set(scores) == set(task.metrics)
    best = {"rougeL": 1.0, "ref_similarity": 1.0, "exact_match": 1.0, "edit_similarity": 1.0}
    assert {k: v for k, v in scores.items() if k in best} == {k: best[k] for k in scores if k in best}
    assert 0.0 <= scores.get("src_similarity", 0.0) <= 1.0


def test_base_messages_is_the_shared_recipe():
    item = {"instruction": "Summarize:", "source": "text"}
    assert base.messages(item) == tasks.messages(item) == [{"role": "user", "content": "Summarize:\n\ntext"}]

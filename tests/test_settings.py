"""The document job's settings (ngramspec/app/settings.py): the defaults are the numbers the code
used before they moved into JobSettings, each field reaches the behaviour it governs, and a bad
value is refused with the field's name. No model: a fake one with a whitespace tokenizer."""

import dataclasses
from types import SimpleNamespace

import pytest

from ngramspec.app.documents import DocumentJob
from ngramspec.app.guard import LoopStop, drift_reason, length_bound, longest_periodic_stretch, loop_allowance
from ngramspec.app.settings import JobSettings

# The module constants of documents.py and guard.py before issue 40 moved them here.
BEFORE = {"chunk_tokens": 768, "min_chunk_tokens": 32, "summary_tokens": 256, "context_chars": 300,
          "unguarded_growth": 2.0, "max_period": 32, "min_loop_tokens": 64, "length_slack": 64,
          "max_growth": 1.3, "growth_slack_chars": 40, "similarity_floor": None, "correction_floor": 0.8,
          "rewording_floor": 0.5, "assumed_context_tokens": 8192, "prompt_tokens": 256}
# (assumed_context_tokens and prompt_tokens were inline numbers; similarity_floor was 0.8 for every
# instruction, now the floor the instruction calls for, issue 49)


def test_defaults_are_the_former_constants():
    assert dataclasses.asdict(JobSettings()) == BEFORE
    doc = JobSettings.__doc__
    for name in BEFORE:  # each field says why it is what it is
        assert f"\n        {name}: " in doc, name


@pytest.mark.parametrize("changes, error, message", [
    ({"chunk_tokens": -1}, ValueError, "JobSettings.chunk_tokens must be at least 32"),
    ({"chunk_tokens": 16, "min_chunk_tokens": 8}, None, ""),  # allowed: the floor moved too
    ({"similarity_floor": 1.5}, ValueError, "JobSettings.similarity_floor takes a similarity between 0 and 1"),
    ({"similarity_floor": -0.1}, ValueError, "JobSettings.similarity_floor"),
    ({"rewording_floor": 1.2}, ValueError, "JobSettings.rewording_floor takes a similarity between 0 and 1"),
    ({"similarity_floor": None}, None, ""),  # by the instruction
    ({"max_growth": 0.9}, ValueError, "JobSettings.max_growth takes a length ratio of at least 1"),
    ({"unguarded_growth": 0.5}, ValueError, "JobSettings.unguarded_growth"),
    ({"max_growth": float("nan")}, ValueError, "JobSettings.max_growth must be a finite number"),
    ({"max_period": 0}, ValueError, "JobSettings.max_period must be at least 1"),
    ({"summary_tokens": 0}, ValueError, "JobSettings.summary_tokens must be at least 1"),
    ({"min_chunk_tokens": 0, "chunk_tokens": 0}, ValueError, "JobSettings.min_chunk_tokens must be at least 1"),
    ({"context_chars": -1}, ValueError, "JobSettings.context_chars must be at least 0"),
    ({"length_slack": -1}, ValueError, "JobSettings.length_slack"),
    ({"growth_slack_chars": -1}, ValueError, "JobSettings.growth_slack_chars"),
    ({"min_loop_tokens": -1}, ValueError, "JobSettings.min_loop_tokens"),
    ({"chunk_tokens": 100.0}, TypeError, "JobSettings.chunk_tokens must be an int"),
    ({"similarity_floor": "0.5"}, TypeError, "JobSettings.similarity_floor must be a number"),
    ({"max_period": True}, TypeError, "JobSettings.max_period must be an int"),
])
def test_a_bad_value_is_refused_naming_the_field(changes, error, message):
    if error is None:
        JobSettings(**changes)
        return
    with pytest.raises(error, match=message):
        JobSettings(**changes)
    with pytest.raises(error, match=message):  # a DocumentJob's settings given by name: the same check
        fake_job(**changes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobSettings().chunk_tokens = 10


# -- each field reaches what it governs -------------------------------------------------------------
class Tokenizer:
    """One token per word (a word's hash), so token counts are word counts."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [hash(w) % 1000 + 2 for w in text.split()]}


def fake_job(max_new_tokens=None, **changes) -> DocumentJob:
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=8192), device="cpu")
    return DocumentJob(model, Tokenizer(), None, max_new_tokens=max_new_tokens, **changes)


def recording(job: DocumentJob, reply) -> list:
    """Replace the job's model calls: each generate() records (context, budget) and answers
    ``reply(body)``."""
    calls = []
    job.prompt_ids = lambda instruction, body, context="": (body, context)
    job.generate = lambda ids, budget, source=None: calls.append((ids[1], budget)) or reply(ids[0])
    return calls


DOCUMENT = "\n\n".join(" ".join(f"w{p}x{i}" for i in range(40)) for p in range(6)) + "\n"


def test_chunk_tokens_sets_the_chunk_size():
    default, small = fake_job(), fake_job(chunk_tokens=40)
    assert len(default.chunks(DOCUMENT, "text")) == 1
    assert len(small.chunks(DOCUMENT, "text")) == 6 and small.chunk_tokens == 40
    assert fake_job(settings=JobSettings(chunk_tokens=80)).settings.chunk_tokens == 80
    assert len(fake_job(settings=JobSettings(chunk_tokens=80)).chunks(DOCUMENT, "text")) == 3


def test_context_chars_and_the_length_bound_reach_each_chunk():
    job = fake_job(chunk_tokens=40, context_chars=12, length_slack=10)
    calls = recording(job, lambda body: body.upper())
    job.rewrite(DOCUMENT, "Shout.")
    assert calls[0] == ("", 52 + 10)  # ceil(1.3 x 40) + length_slack
    assert all(len(context) == 12 for context, _ in calls[1:])
    job = fake_job(chunk_tokens=40, context_chars=0, similarity_floor=0, length_slack=0, unguarded_growth=3.0)
    calls = recording(job, lambda body: body.upper())
    job.rewrite(DOCUMENT, "Shout.")
    assert {c for c in calls} == {("", 120)}  # the guard off: unguarded_growth x 40; no context shown


def test_summary_tokens_is_a_summary_s_budget():
    job = fake_job(summary_tokens=17)
    calls = recording(job, lambda body: "short")
    job.summarize("one two three")
    assert calls == [("", 17)]
    job = fake_job(max_new_tokens=5, summary_tokens=17)
    calls = recording(job, lambda body: "short")
    job.summarize("one two three")
    assert calls == [("", 5)]  # max_new_tokens wins


def test_the_similarity_floor_and_growth_decide_what_is_kept():
    source = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
    drifted = "A fast brown fox leaps above a sleepy dog and then it runs far into the woods."
    fix = "Fix any spelling mistakes. Change nothing else."
    assert drift_reason(source, drifted, "text", instruction=fix).startswith("similarity")  # floor 0.8
    assert drift_reason(source, drifted, "text", instruction="Restyle this.") == ""  # rewording: 0.5
    assert drift_reason(source, drifted, "text", JobSettings(similarity_floor=0.5), instruction=fix) == ""
    assert drift_reason(source, drifted, "text", JobSettings(similarity_floor=0.9),
                        instruction="Restyle.").startswith("similarity")  # a given floor holds for all
    job = fake_job()  # through a DocumentJob: the instruction decides
    recording(job, lambda body: drifted)
    assert job.rewrite(source, "Restyle.") == drifted and not job.stats.guarded
    job = fake_job()
    recording(job, lambda body: drifted)
    assert job.rewrite(source, fix) == source and job.stats.guarded
    longer = source + " It was a fine day."  # 103 characters against 84: within 1.3 x 84 + 40
    assert drift_reason(source, longer, "text") == ""
    assert "as long as its source" in drift_reason(source, longer, "text", JobSettings(growth_slack_chars=0,
                                                                                        max_growth=1.1))
    assert drift_reason(source, longer, "text", JobSettings(growth_slack_chars=0, max_growth=1.3)) == ""


@pytest.mark.parametrize("instruction, floor", [
    ("Fix any spelling mistakes. Change nothing else.", 0.8),
    ("Fix the grammatical errors in this text while keeping it fluent:", 0.8),
    ("Correct the typos.", 0.8),
    ("Proofread this.", 0.8),
    ("Fix the punctuation and capitalization.", 0.8),
    ("Simplify this sentence while keeping its meaning:", 0.5),
    ("Make the sentence clearer:", 0.5),
    ("Fix the fluency of the sentence:", 0.5),  # fluency is rewording
    ("Revise this text to improve it:", 0.5),
    ("", 0.5),
])
def test_the_floor_follows_what_the_instruction_asks(instruction, floor):
    assert JobSettings().floor(instruction) == floor
    assert JobSettings(similarity_floor=0.7).floor(instruction) == 0.7


def test_the_loop_stop_reads_max_period_and_min_loop_tokens():
    loop = [1, 2, 3, 4, 5] * 10  # period 5
    assert longest_periodic_stretch(loop) == 50
    assert longest_periodic_stretch(loop, max_period=4) == 0
    assert loop_allowance([9, 8, 7]) == 64 and loop_allowance([9, 8, 7], JobSettings(min_loop_tokens=10)) == 10
    stop = LoopStop([9, 8, 7], 0, JobSettings(min_loop_tokens=10))
    assert stop.allowance == 10
    fired = next(k for k in range(1, len(loop) + 1) if stop._push(loop[k - 1]))
    assert fired == 11  # the first token past a periodic stretch of 10
    short = LoopStop([9, 8, 7], 0, JobSettings(min_loop_tokens=10, max_period=4))
    assert not any(short._push(t) for t in loop)  # period 5 is beyond its max_period
    assert length_bound(10, JobSettings(max_growth=2.5, length_slack=1)) == 26


def test_chunks_are_capped_to_fit_the_context_the_settings_assume():
    """A model that states no context length gets assumed_context_tokens; chunks then take a
    third of what prompt_tokens leave."""
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=None))
    tokenizer = SimpleNamespace()
    job = DocumentJob(model, tokenizer, assumed_context_tokens=1000, prompt_tokens=100, chunk_tokens=768)
    assert (job.context_limit, job.chunk_tokens) == (1000, 300)
    assert DocumentJob(model, tokenizer, assumed_context_tokens=1000, prompt_tokens=400).chunk_tokens == 200

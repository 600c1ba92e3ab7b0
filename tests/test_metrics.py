"""DecodeStats: counters of one call and the dict stored by the harness and printed by --stats."""

import dataclasses
import json

from ngramspec.draft.metrics import DecodeStats


def test_as_dict_holds_every_counter_and_the_rounded_rates():
    stats = DecodeStats(prompt_tokens=3, new_tokens=7, wall_seconds=0.123456, drafter_seconds=2e-5)
    stats.record_prefill()
    stats.record_step(3, 2)
    stats.record_step(0, 0, declined=True)
    stats.record_step(1, 1)
    record = stats.as_dict()
    assert set(record) >= {f.name for f in dataclasses.fields(DecodeStats)}  # no counter left out
    assert record["verified_per_step"] == [3, 0, 1] and record["accepted_per_step"] == [2, 0, 1]
    assert (record["drafted_at"], record["accepted_at"]) == ([2, 1, 1], [2, 1, 0])
    assert record["mat"] == round(7 / 4, 4) and record["acceptance_rate"] == 0.75
    assert record["acceptance_by_position"] == [1.0, 1.0, 0.0]
    assert record["wall_seconds"] == 0.1235 and record["tokens_per_second"] == round(7 / 0.123456, 2)
    assert record["drafter_us_per_step"] == 5.0 and record["drafter_seconds"] == 2e-5
    assert record["declined_steps"] == 1 and record["steps_with_draft"] == 2
    assert json.loads(json.dumps(record)) == record  # stored as JSON by the harness
    record["drafted_at"].append(9)
    assert stats.drafted_at == [2, 1, 1]  # a copy: editing the dict leaves the stats alone

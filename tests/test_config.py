import dataclasses

import pytest

from ngramspec import NgramSpeculator, SpeculatorConfig


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"min_n": 0}, "min_n must be >= 1"),
        ({"min_n": 3, "max_n": 2}, r"max_n \(2\) must be >= min_n \(3\)"),
        ({"max_draft_tokens": 0}, "max_draft_tokens must be >= 1"),
        ({"max_draft_tokens": -3}, "max_draft_tokens must be >= 1"),
        ({"match": "leftmost"}, "match must be one of"),
        ({"draft_tokens_per_match_token": -1}, "draft_tokens_per_match_token must be >= 0"),
        ({"max_n": 1000}, "max_n must be <= 64"),
    ],
)
def test_invalid_settings_are_rejected(settings, message):
    with pytest.raises(ValueError, match=message):
        SpeculatorConfig(**settings)
    with pytest.raises(ValueError, match=message):
        NgramSpeculator(**settings)


def test_non_int_settings_are_rejected():
    with pytest.raises(TypeError, match="max_draft_tokens must be an int"):
        SpeculatorConfig(max_draft_tokens=2.5)
    with pytest.raises(TypeError, match="min_n must be an int"):
        SpeculatorConfig(min_n=True)


def test_config_is_frozen_and_overridable():
    config = SpeculatorConfig(max_n=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_n = 5
    spec = NgramSpeculator(config, max_draft_tokens=4)
    assert spec.config.max_n == 3 and spec.config.max_draft_tokens == 4
    with pytest.raises(TypeError, match="config must be a SpeculatorConfig"):
        NgramSpeculator({"max_n": 3})


def test_draft_limit_scales_with_match_length():
    config = SpeculatorConfig(max_draft_tokens=5, draft_tokens_per_match_token=2)
    assert [config.draft_limit(n) for n in (1, 2, 3)] == [2, 4, 5]
    assert SpeculatorConfig(max_draft_tokens=5, draft_tokens_per_match_token=0).draft_limit(1) == 5

import dataclasses

import pytest

from ngramspec import NgramSpeculator, SpeculatorConfig
from ngramspec.draft.config import parse_settings


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"min_n": 0}, "min_n must be >= 1"),
        ({"min_n": 3, "max_n": 2}, r"max_n \(2\) must be >= min_n \(3\)"),
        ({"max_draft_tokens": 0}, "max_draft_tokens must be >= 1"),
        ({"max_draft_tokens": -3}, "max_draft_tokens must be >= 1"),
        ({"match": "leftmost"}, "match must be one of"),
        ({"acceptance_prior": 1.0}, r"acceptance_prior must be in \(0, 1\)"),
        ({"acceptance_memory": -0.1}, r"acceptance_memory must be in \[0, 1\]"),
        ({"verify_cost": ((2, 1.0), (4, 2.0))}, "must start at q=1"),
        ({"verify_cost": ((1, 1.0), (1, 2.0))}, "strictly increasing"),
        ({"verify_cost": ((1, 1.0), (4, -2.0))}, "must be positive"),
        ({"verify_cost": "cheap"}, r"must be \(\(q, cost\), ...\) pairs"),
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
    with pytest.raises(TypeError, match="payoff_sizing must be True or False"):
        SpeculatorConfig(payoff_sizing=1)


def test_config_is_frozen_and_overridable():
    config = SpeculatorConfig(max_n=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_n = 5
    spec = NgramSpeculator(config, max_draft_tokens=4)
    assert spec.config.max_n == 3 and spec.config.max_draft_tokens == 4
    with pytest.raises(TypeError, match="config must be a SpeculatorConfig"):
        NgramSpeculator({"max_n": 3})


def test_a_fixed_verify_cost_is_the_speculators_cost_model_and_never_learns():
    spec = NgramSpeculator(max_draft_tokens=4, max_tree_tokens=4, verify_cost=((1, 1.0), (3, 2.0)))
    # linear in between, then proportional to tokens (compute-bound) past the last point
    assert spec.cost_model.table(500, 5).tolist() == [0.0, 1.0, 1.5, 2.0, 2.0 * 4 / 3, 2.0 * 5 / 3]
    assert spec.cost_model(30, 100_000) == 20.0 and spec.cost_model(0, 500) == 0.0  # at any context
    spec.cost_model.observe(2, 500, 1.0)
    spec.cost_model.observe_step(8, 500, 1, 1.0)
    assert spec.cost_model.observations == spec.cost_model.steps_observed == 0 and not spec.cost_model.learn
    assert not spec.cost_model.needs_baseline(500)  # so no plain step is forced to measure one
    assert NgramSpeculator().cost_model.learn  # verify_cost=None: the online model


def test_overrides_from_text():
    config = SpeculatorConfig.from_overrides("min_n=1, payoff_sizing=false,verify_cost=1:1.0,8:1.5, match=earliest")
    assert (config.min_n, config.payoff_sizing, config.match) == (1, False, "earliest")
    assert config.verify_cost == ((1, 1.0), (8, 1.5))
    assert SpeculatorConfig.from_overrides("verify_cost=auto", base=config).verify_cost is None
    assert SpeculatorConfig.from_overrides("") == SpeculatorConfig()
    with pytest.raises(ValueError, match="unknown speculator setting 'n_max'"):
        SpeculatorConfig.from_overrides("n_max=3")
    with pytest.raises(ValueError, match="payoff_sizing must be true or false"):
        SpeculatorConfig.from_overrides("payoff_sizing=maybe")
    with pytest.raises(ValueError, match="max_n must be an integer"):
        SpeculatorConfig.from_overrides("max_n=four")


def test_settings_text_is_split_once_for_every_command_line():
    assert parse_settings("") == {}
    assert parse_settings(" min_n = 1 ,, k=5") == {"min_n": "1", "k": "5"}
    # A part without "=" continues the value before it: a cost curve holds commas.
    assert parse_settings("verify_cost=1:1.0,8:1.5,max_n=4") == {"verify_cost": "1:1.0,8:1.5", "max_n": "4"}
    assert parse_settings("a=b=c") == {"a": "b=c"}  # only the first "=" separates
    with pytest.raises(ValueError, match="expected name=value in '4,min_n=1'"):
        parse_settings("4,min_n=1")

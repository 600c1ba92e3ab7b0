import dataclasses
import re

import pytest

from ngramspec import NgramSpeculator, SpeculatorConfig
from ngramspec.draft.config import (
    READERS,
    SettingError,
    parse_config,
    read_settings,
    setting_fields,
    split_settings,
)


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


def test_settings_text_is_read_by_each_fields_type():
    config = parse_config("min_n=1, payoff_sizing=false,verify_cost=1:1.0,8:1.5, match=earliest")
    assert (config.min_n, config.payoff_sizing, config.match) == (1, False, "earliest")
    assert config.verify_cost == ((1, 1.0), (8, 1.5))
    assert parse_config("verify_cost=auto", base=config).verify_cost is None
    assert parse_config("acceptance_prior=0.7").acceptance_prior == 0.7
    assert parse_config("") == SpeculatorConfig()
    with pytest.raises(SettingError, match="unknown speculator setting 'n_max'; known: min_n, max_n, "):
        parse_config("n_max=3")
    with pytest.raises(SettingError, match="payoff_sizing must be true or false, got 'maybe'"):
        parse_config("payoff_sizing=maybe")
    with pytest.raises(SettingError, match="max_n must be an integer, got 'four'"):
        parse_config("max_n=four")
    with pytest.raises(SettingError, match="verify_cost must be auto or a cost curve"):
        parse_config("verify_cost=1:1,8:abc")


def test_every_setting_has_a_reader_and_a_description():
    described = SpeculatorConfig.describe()
    for name, (_, field) in setting_fields().items():
        assert field.type in READERS, name
        assert len(described[name]) > 10, name


def test_settings_text_is_split_once_for_every_command_line():
    assert split_settings("") == {}
    assert split_settings(" min_n = 1 ,, k=5") == {"min_n": "1", "k": "5"}
    # A part without "=" continues the value before it: a cost curve holds commas.
    assert split_settings("verify_cost=1:1.0,8:1.5,max_n=4") == {"verify_cost": "1:1.0,8:1.5", "max_n": "4"}
    assert split_settings("a=b=c") == {"a": "b=c"}  # only the first "=" separates
    with pytest.raises(ValueError, match="expected name=value in '4,min_n=1'"):
        split_settings("4,min_n=1")


# --- One parser, four routes: the same text gives the same config, or the same error --------

def _by_keywords(text):
    return NgramSpeculator(**read_settings(text)).config


def _by_flags(text):
    from ngramspec.app.cli import _speculator_config, build_parser

    argv = ["rewrite", "in.txt", "--instruction", "x"]
    for name, value in split_settings(text).items():
        flag = "--" + name.replace("_", "-").replace(".", "-")  # cost_tuning.window: --cost-tuning-window
        argv += [flag] if value == "true" else ["--no-" + flag[2:]] if value == "false" else [flag, value]
    return _speculator_config(build_parser().parse_args(argv))


def _by_environment(text):
    """vLLM's drafter, over its own base (its max_draft, the history on)."""
    from ngramspec.vllm.settings import SETTINGS_ENV, speculator_config

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SETTINGS_ENV, text)
        return speculator_config(24)


def _by_method_string(text):
    from eval.drafters import make_drafter
    from eval.methods import make_method, parse_method

    spec = parse_method("ngramspec" + (":" + text if text else ""))
    config = make_method(spec).speculator.config
    assert make_drafter(spec).config == config
    return config


def _vllm_base():
    from ngramspec.vllm.settings import speculator_config

    return speculator_config(24, "")


# route -> (the config it builds from settings text, the base it starts from)
ROUTES = {"keywords": (_by_keywords, SpeculatorConfig), "flags": (_by_flags, SpeculatorConfig),
          "NGRAMSPEC_SETTINGS": (_by_environment, _vllm_base), "method string": (_by_method_string, SpeculatorConfig)}


@pytest.mark.parametrize("text", [
    "max_n=4,min_n=2",
    "verify_cost=1:1.0,8:1.5,max_draft_tokens=12",
    "payoff_sizing=false,acceptance_prior=0.6,acceptance_memory=0.8",
    "match=earliest,copy_cursor=false,fuzzy_resync=true",
    "history_tokens=5000,edit_recurrence=true",  # (vLLM refuses tree_branches > 1: it verifies chains)
    "cost_tuning.window=20,max_n=4,cost_tuning.explore_scale=0.5",
    "draft_tuning.fuzzy_window=6,draft_tuning.max_edits=2,draft_tuning.pool_window=512",
])
def test_every_route_gives_the_same_config_for_the_same_text(text):
    assert parse_config(text) != SpeculatorConfig()
    for route, (build, base) in ROUTES.items():
        assert build(text) == parse_config(text, base()), route


@pytest.mark.parametrize("text, message", [
    ("n_max=3", "unknown speculator setting 'n_max'; known: min_n, max_n"),
    ("max_n=four", "max_n must be an integer, got 'four'"),
    ("acceptance_prior=high", "acceptance_prior must be a number, got 'high'"),
    ("verify_cost=1:1,8:abc", "verify_cost must be auto or a cost curve"),
    ("min_n=0", "min_n must be >= 1"),
    ("acceptance_memory=1.5", r"acceptance_memory must be in \[0, 1\]"),
    ("cost_tuning.window=0", r"cost_tuning.window must be >= 1"),
    ("cost_tuning.same_load=fast", r"cost_tuning.same_load must be a number, got 'fast'"),
    ("draft_tuning.edit_span=0", r"draft_tuning.edit_span must be >= 1"),
])
def test_every_route_refuses_a_bad_setting_with_the_same_message(text, message, capsys):
    from ngramspec.app.process import CliError

    with pytest.raises(SettingError, match=message):
        parse_config(text)
    for route in ("keywords", "NGRAMSPEC_SETTINGS"):
        with pytest.raises(SettingError, match=message):
            ROUTES[route][0](text)
    with pytest.raises(ValueError, match=message):  # eval names the method before the message
        _by_method_string(text)
    if next(iter(split_settings(text))) in setting_fields():  # a flag exists (an unknown name has none)
        with pytest.raises((SystemExit, CliError)) as caught:  # argparse's usage error, or the CLI's: exit 2
            _by_flags(text)
        shown = capsys.readouterr().err if caught.type is SystemExit else str(caught.value)
        assert re.search(message, shown), shown


def test_keywords_name_an_unknown_setting_like_text_does():
    with pytest.raises(SettingError, match="unknown speculator setting 'n_max'; known: min_n"):
        NgramSpeculator(n_max=3)
    with pytest.raises(SettingError, match="unknown speculator setting 'n_max'"):
        NgramSpeculator(SpeculatorConfig(), n_max=3)


def test_the_cost_models_tuning_is_a_sub_config_the_speculator_hands_on():
    from ngramspec.cost.costmodel import CostModelTuning

    tuning = CostModelTuning(window=5, min_samples=1)
    assert NgramSpeculator(cost_tuning=tuning).cost_model.tuning == tuning
    assert NgramSpeculator(cost_tuning=tuning, verify_cost=((1, 1.0), (8, 1.5))).cost_model.tuning == tuning
    assert parse_config("cost_tuning.window=5,cost_tuning.min_samples=1").cost_tuning == tuning
    # a group's settings stack over the base's sub-config, not over the defaults
    assert parse_config("cost_tuning.window=7", parse_config("cost_tuning.min_samples=1")).cost_tuning == (
        CostModelTuning(window=7, min_samples=1))
    with pytest.raises(SettingError, match="cost_tuning must be a CostModelTuning"):
        SpeculatorConfig(cost_tuning={"window": 5})
    with pytest.raises(SettingError, match=r"cost_tuning.min_samples \(9\) must be <= window \(5\)"):
        parse_config("cost_tuning.window=5,cost_tuning.min_samples=9")

"""Cost curves: one object prices forwards for config and replay; a model's curve is measured once per
model/device/dtype, cached, and re-measured when stale."""

import pytest

import ngramspec.cost.curves as costs
from ngramspec import NgramSpeculator, SpeculatorConfig
from ngramspec.draft.config import CPU_VERIFY_COST
from ngramspec.draft.replay import ForwardCost, replay

from conftest import tiny_llama


def test_cost_curve_is_cached_per_model_and_refreshed_when_stale(monkeypatch, tmp_path):
    monkeypatch.setenv("NGRAMSPEC_CACHE", str(tmp_path))
    calls = []
    real = costs.measure_cost_curve

    def counting(model, *args, **kwargs):
        calls.append(1)
        return real(model, context=16, qs=(1, 2, 4, 8), repeats=1)

    monkeypatch.setattr(costs, "measure_cost_curve", counting)
    model = tiny_llama()
    first = NgramSpeculator.for_model(model, max_draft_tokens=6)
    assert calls == [1] and first.config.verify_cost[0] == (1, 1.0) and first.config.max_draft_tokens == 6
    assert [q for q, _ in first.config.verify_cost] == [1, 2, 4, 8]
    second = NgramSpeculator.for_model(model)
    assert calls == [1] and second.config.verify_cost == first.config.verify_cost  # from the cache
    NgramSpeculator.for_model(model, max_age_days=0)  # stale: measured again
    assert calls == [1, 1]
    NgramSpeculator.for_model(tiny_llama(dtype=__import__("torch").float32))  # another dtype: own entry
    assert calls == [1, 1, 1]
    assert len(list((tmp_path / "costs").glob("*.json"))) == 2


def test_curve_is_linear_between_points_and_proportional_past_the_last():
    curve = costs.CostCurve(((1, 1.0), (3, 2.0)))
    assert curve(2) == pytest.approx(1.5) and curve(1) == 1.0 and curve(3) == 2.0
    assert curve(30) == pytest.approx(20.0)  # 2.0 per 3 tokens, as at the last point
    assert curve(0) == 0.0  # no forward, no cost


@pytest.mark.parametrize(
    "points, message",
    [
        (((2, 1.0), (4, 2.0)), "must start at q=1"),
        (((1, 1.0), (1, 2.0)), "strictly increasing"),
        ((), "must start at q=1"),
        (((1, 1.0), (4, -2.0)), "must be positive"),
        (((1, 0.0),), "must be positive"),
        ("cheap", r"must be \(\(q, cost\), ...\) pairs"),
        (((1, "x"),), r"must be \(\(q, cost\), ...\) pairs"),
    ],
)
def test_bad_points_are_rejected_with_the_config_messages(points, message):
    with pytest.raises(ValueError, match=message):
        costs.CostCurve(points)


def test_parse_reads_command_line_curves_and_names_the_format_on_error():
    curve = costs.CostCurve.parse("1:1.0,4:1.4,8:1.5")
    assert curve.points == ((1, 1.0), (4, 1.4), (8, 1.5))
    assert costs.CostCurve.parse(curve.text()) == curve
    for text in ("1-1.0", "1:1.0,x:2", "", "1:1.0:2"):
        with pytest.raises(ValueError, match="must look like '1:1.0,4:1.4,8:1.5'"):
            costs.CostCurve.parse(text)
    with pytest.raises(ValueError, match="must start at q=1"):
        costs.CostCurve.parse("2:1.0")


def test_the_config_and_replay_price_forwards_with_the_same_curve_object():
    config = SpeculatorConfig(verify_cost=((1, 1.0), (3, 2.0)))
    curve, model = costs.CostCurve(config.verify_cost), NgramSpeculator(config).cost_model
    assert [model(q, 500) for q in (0, 2, 30)] == [curve(q) for q in (0, 2, 30)]
    assert SpeculatorConfig().verify_cost is None  # auto: the online cost model sizes drafts
    assert costs.CPU_PRIOR.curves[0][2] == costs.DEFAULT_CPU_CURVE.points  # its prior's first curve
    assert costs.DEFAULT_CPU_CURVE.points == CPU_VERIFY_COST
    assert ForwardCost is costs.CostCurve
    # With no curve, replay prices forwards by the steep curve: the prefill (1) plus one step
    # verifying the drafted "2 3 4" with the last token (q = 4), which emits "2 3 4 9".
    spec = NgramSpeculator(min_n=1, max_n=2, max_draft_tokens=3, payoff_sizing=False)
    result = replay(spec.start([1, 2, 3, 4, 5]), [1, 2, 3, 4, 9])
    assert result.cost == pytest.approx(1.0 + costs.STEEP_CPU_CURVE(4))
    assert costs.STEEP_CPU_CURVE(4) != costs.DEFAULT_CPU_CURVE(4)

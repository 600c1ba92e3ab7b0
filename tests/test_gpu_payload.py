"""The GPU check's payload (eval/gpu_payload.py): pip's resolver, run against stand-ins of what a
GPU image holds, names exactly what the image lacks."""

import json
import subprocess
import sys

import pytest

from eval import gpu_payload

from conftest import call_main


def test_the_image_lists_this_interpreter_and_its_distributions():
    held = gpu_payload.image()
    assert held["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert {"torch", "transformers", "numba"} <= set(held["dists"])
    assert any(r.startswith("numpy") for r in held["dists"]["numba"]["requires"])


def test_stand_ins_read_back_as_installed_distributions(tmp_path):
    held = {"python": "3.12", "dists": {"foo-bar": {"name": "Foo_Bar", "version": "1.2.3",
                                                    "requires": ["numpy>=2", "tqdm; extra == 'cli'"]}}}
    gpu_payload.write_stand_ins(held, tmp_path)
    read = subprocess.run([sys.executable, "-c", "from importlib import metadata as m; d = m.distribution('foo-bar'); "
                           "print(d.version, d.requires)"], env={"PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, check=True).stdout
    assert read.strip() == "1.2.3 ['numpy>=2', \"tqdm; extra == 'cli'\"]"


@pytest.mark.slow
def test_resolving_against_an_image_names_only_what_it_lacks(tmp_path):
    """This environment as the image: it lacks nothing. The same image without tqdm and with an
    older rapidfuzz: exactly those two are downloaded, each as a wheel for the image."""
    held = gpu_payload.image()
    transformers = held["dists"]["transformers"]["version"]
    assert gpu_payload.resolve(held, tmp_path / "same", transformers) == []
    tqdm = held["dists"].pop("tqdm")["version"]
    held["dists"]["rapidfuzz"]["version"] = "2.0.0"
    needed = gpu_payload.resolve(held, tmp_path / "older", transformers)
    assert sorted(n.split("==")[0].lower() for n in needed) == ["rapidfuzz", "tqdm"]
    assert f"tqdm=={tqdm}" in needed
    wheels = sorted(p.name.split("-")[0].lower() for p in (tmp_path / "older" / "whl").glob("*.whl"))
    assert wheels == ["rapidfuzz", "tqdm"]


def test_the_command_line_explains_itself(capsys):
    from eval.__main__ import main

    code, _, err = call_main(main, ["gpu-payload"], capsys)
    assert code == 2 and "required: STEP" in err
    code, out, _ = call_main(main, ["gpu-payload", "resolve", "--help"], capsys)
    assert code == 0 and "IMAGE.json DIR" in out and "--transformers" in out
    json.dumps(gpu_payload.image())  # the manifest is plain JSON


def test_a_distribution_listed_without_a_version_meets_any_lower_bound(tmp_path):
    """The committed description names some distributions without their version: their stand-in
    claims UNREAD_VERSION, so the resolver takes them as present (``check`` on the machine is what
    catches a real version that is too old)."""
    held = {"python": "3.12", "dists": {"foo": {"name": "foo", "version": None, "requires": []}}}
    gpu_payload.write_stand_ins(held, tmp_path)
    read = subprocess.run([sys.executable, "-c", "from importlib import metadata as m; print(m.version('foo'))"],
                          env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, check=True).stdout
    assert read.strip() == gpu_payload.UNREAD_VERSION


def test_the_committed_image_description_is_one_prepare_can_read():
    held = json.loads((gpu_payload.Path(gpu_payload.__file__).parent / "gpu_image.json").read_text())
    assert held["python"] == "3.12"
    assert held["dists"]["torch"]["version"].startswith("2.") and held["dists"]["transformers"]["version"]
    assert all(set(d) == {"name", "version", "requires"} for d in held["dists"].values())


def test_unmet_names_each_missing_or_too_old_requirement():
    from importlib.metadata import version

    numpy = version("numpy")
    assert gpu_payload.unmet([f"numpy>={numpy}", "numpy"]) == []
    assert gpu_payload.unmet(["numpy>=999", "no-such-distribution-here>=1"]) == [
        f"numpy>=999: {numpy} installed", "no-such-distribution-here>=1: not installed"]


def test_check_exits_3_naming_an_unmet_requirement(capsys):
    from importlib.metadata import version

    from eval.__main__ import main

    installed = version("transformers")
    code, out, _ = call_main(main, ["gpu-payload", "check", "--transformers", installed], capsys)
    assert code == 0 and "requirements met" in out
    code, out, _ = call_main(main, ["gpu-payload", "check", "--transformers", "0.0.1"], capsys)
    assert code == 3 and f"unmet: transformers==0.0.1: {installed} installed" in out

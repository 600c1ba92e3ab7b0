"""The GPU check's payload: what a GPU machine without network access needs, resolved against
what its image already holds (``eval/gpu_check.sh`` drives it; see its header).

    python -m eval gpu-payload image OUT.json     on the GPU machine: its Python, platform and
                                                  installed distributions with their requirements
    python -m eval gpu-payload resolve IMAGE.json DIR [--transformers VERSION]
                                                  here: pip's resolver, run against stand-ins of
                                                  the image's distributions, names what the image
                                                  lacks; those wheels are downloaded into DIR/whl
                                                  (transformers: the version installed here)
    python -m eval gpu-payload check [--transformers VERSION]
                                                  on the GPU machine, once the wheels are in place:
                                                  every requirement met, or exit 3 naming each
                                                  one that is not (seconds, before any test)

``eval/gpu_image.json`` is the committed description of the GPU image, so ``prepare`` runs here
with no machine start. Where it lists a distribution without a version (the description named
it, no version was read), its stand-in claims ``UNREAD_VERSION``: pip then takes it to meet any
lower bound, and ``check`` on the machine is what catches a real version that does not.

A stand-in is a ``.dist-info`` folder holding only the name, the version and the requirements:
pip treats it as installed, so a requirement the image meets is left alone (its torch, CUDA
libraries, numpy...) and only what is missing or too old is downloaded, for the image's Python.
Only the standard library is imported: the image step runs before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What the check imports on the GPU machine, beyond torch (the image's CUDA build is used as it
# is): the package's own dependencies, datasets for the item files, pytest for tests/test_cuda.py.
# transformers is pinned to the version the local tests ran with (``--transformers``).
REQUIREMENTS = ("numba>=0.60", "numpy", "rapidfuzz>=3", "gguf>=0.10", "accelerate>=1.0", "tqdm", "datasets>=3",
                "pytest>=8")
# manylinux tags a current x86-64 image accepts (glibc 2.28 or newer)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")


def image() -> dict:
    """This interpreter's version and every installed distribution (the first on sys.path wins,
    as imports do) with its requirements."""
    from importlib import metadata

    dists: dict[str, dict] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in dists:
            dists[canonical(name)] = {"name": name, "version": dist.version, "requires": dist.requires or []}
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "dists": dists}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


UNREAD_VERSION = "9999"


def write_stand_ins(held: dict, site: Path) -> None:
    for dist in held["dists"].values():
        version = dist["version"] or UNREAD_VERSION
        info = site / f"{canonical(dist['name']).replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        lines = ["Metadata-Version: 2.1", f"Name: {dist['name']}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in dist["requires"]]
        (info / "METADATA").write_text("\n".join(lines) + "\n")


def resolver_python(version: str) -> str:
    """An interpreter of the image's minor version that runs: RESOLVER_PYTHON, this one's base
    interpreter, or the first ``pythonX.Y`` on PATH that runs (a version manager's shim may not)."""
    wanted = str(tuple(int(v) for v in version.split(".")))
    candidates = [os.environ.get("RESOLVER_PYTHON"), getattr(sys, "_base_executable", None)]
    candidates += [str(Path(d) / f"python{version}") for d in os.environ.get("PATH", "").split(os.pathsep)]
    # pyenv's shims on PATH refuse a version that is not selected; its installs run as they are
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(str(p) for p in pyenv.glob(f"{version}*/bin/python{version}"))
    tried = []
    for python in filter(None, candidates):
        if not os.access(python, os.X_OK) or python in tried:
            continue
        tried.append(python)
        found = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True).stdout.strip()
        if found == wanted:
            return python
    raise SystemExit(f"resolving for the image needs a Python {version} that runs: put python{version} on PATH "
                     f"or name it in RESOLVER_PYTHON (tried: {', '.join(tried) or 'none'})")


def resolve(held: dict, out: Path, transformers: str) -> list[str]:
    """``name==version`` of every distribution the image lacks, as pip's resolver picks them for
    the image's Python; their wheels are downloaded into ``out/whl``."""
    wanted = [f"transformers=={transformers}", *REQUIREMENTS]
    target = ["--python-version", held["python"], "--implementation", "cp", "--only-binary=:all:"]
    target += [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    with tempfile.TemporaryDirectory() as tmp:
        # An empty environment that sees only the stand-ins and a copy of pip (pip's own folder
        # sits among this environment's packages, which must stay out of sight).
        # pip resolves only for the Python it runs on: one of the image's minor version.
        python = resolver_python(held["python"])
        resolver = Path(tmp) / "resolver"
        subprocess.run([python, "-m", "venv", "--without-pip", str(resolver)], check=True)
        site = Path(tmp) / "image-site"
        write_stand_ins(held, site)
        import pip

        shutil.copytree(Path(pip.__file__).parent, Path(tmp) / "pip-only" / "pip")
        report = Path(tmp) / "report.json"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PYTHONPATH"] = f"{site}:{Path(tmp) / 'pip-only'}"
        subprocess.run([str(resolver / "bin" / "python"), "-m", "pip", "install", "-q", "--dry-run",
                        "--only-binary=:all:", "--report", str(report), *wanted], check=True, env=env, cwd=tmp)
        needed = [f"{item['metadata']['name']}=={item['metadata']['version']}"
                  for item in json.loads(report.read_text())["install"]]
    (out / "whl").mkdir(parents=True, exist_ok=True)
    if needed:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(out / "whl"), *target,
                        *needed], check=True)
    return needed


def unmet(requirements) -> list[str]:
    """Each requirement this interpreter's installed distributions do not meet, with why."""
    from importlib import metadata

    from packaging.requirements import Requirement

    problems = []
    for text in requirements:
        requirement = Requirement(text)
        try:
            found = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{text}: not installed")
            continue
        if not requirement.specifier.contains(found, prereleases=True):
            problems.append(f"{text}: {found} installed")
    return problems


def add_arguments(parser) -> None:
    steps = parser.add_subparsers(dest="step", required=True, metavar="STEP")
    image_step = steps.add_parser("image", help="on the GPU machine: its Python and distributions -> OUT.json")
    image_step.add_argument("out", metavar="OUT.json")
    resolve_step = steps.add_parser("resolve", help="here: the wheels the image lacks, downloaded into DIR/whl")
    resolve_step.add_argument("image", metavar="IMAGE.json")
    resolve_step.add_argument("dir", metavar="DIR")
    resolve_step.add_argument("--transformers", default=None,
                              help="the transformers version to install (default: the one installed here)")
    check_step = steps.add_parser("check", help="on the GPU machine: every requirement met, or exit 3 naming each")
    check_step.add_argument("--transformers", default=None, help="the transformers version the payload carries")


def main(args) -> int:
    if args.step == "image":
        Path(args.out).write_text(json.dumps(image(), indent=1))
        return 0
    if args.step == "check":
        problems = unmet([*REQUIREMENTS, "torch", *([f"transformers=={args.transformers}"] if args.transformers
                                                     else [])])
        for problem in problems:
            print(f"unmet: {problem}")
        if problems:
            print("eval/gpu_image.json describes this image wrongly: run `bash eval/gpu_check.sh image` here, copy "
                  "its image.json to eval/gpu_image.json, prepare again")
            return 3
        print(f"requirements met: {len(REQUIREMENTS) + 1 + bool(args.transformers)}")
        return 0
    held = json.loads(Path(args.image).read_text())
    from importlib.metadata import version

    needed = resolve(held, Path(args.dir), args.transformers or version("transformers"))
    (Path(args.dir) / "needed.txt").write_text("".join(f"{n}\n" for n in needed))
    print(f"the image (Python {held['python']}, {len(held['dists'])} distributions) lacks {len(needed)}: "
          + (" ".join(needed) or "nothing"))
    return 0

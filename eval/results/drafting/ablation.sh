#!/usr/bin/env bash
# Ablation of the drafting features in replay (no model needed; ~1 minute).
# Usage: bash eval/results/drafting/ablation.sh   (from the repository root)
# The tables here were made before the method names were unified (eval/methods.py): they say
# hf-rule for hf-pld and vllm-rule for ngram:min_n=1,max_n=4,k=5. Rerun, every figure is the same.
set -euo pipefail
OUT=${OUT:-eval/results/drafting}
TRACES=eval/results/drafting/greedy_traces.jsonl
BASE="min_n=2,copy_cursor=false,fuzzy_resync=false"   # the drafter before these features
STEEP="1:1.0,2:1.1,3:1.17,4:1.6,8:1.94,11:2.3,16:2.45,32:2.9"  # ../shared/GUIDE.md's 2-core curve
variants() {  # $1: extra settings for every ngramspec variant (e.g. its cost curve)
  local x=${1:+,$1}
  echo "hf-pld,ngram:min_n=1,max_n=4,k=5,oracle,ngramspec:$BASE$x,ngramspec:$BASE,copy_cursor=true$x,ngramspec:$BASE,fuzzy_resync=true$x,ngramspec:$BASE,min_n=1$x,ngramspec:$BASE,tree_branches=3$x,ngramspec:$BASE,history_tokens=50000$x,ngramspec:$BASE,payoff_sizing=false$x,ngramspec:$BASE,edit_recurrence=true$x,ngramspec:min_n=1,copy_cursor=true,fuzzy_resync=true$x,ngramspec:min_n=1,copy_cursor=true,fuzzy_resync=true,tree_branches=3$x,ngramspec:min_n=1,copy_cursor=true,fuzzy_resync=true,history_tokens=50000$x,ngramspec:min_n=1,copy_cursor=true,fuzzy_resync=true,edit_recurrence=true$x"
}
# 1. The cost curve measured on this machine (the default verify_cost): sizing and costing agree.
"${PYTHON:-python}" -m eval replay "$TRACES" --methods "$(variants)" --out "$OUT/replay_cpu_curve"
# 2. A steeper curve (GUIDE.md section 4), with the drafter told that curve too.
"${PYTHON:-python}" -m eval replay "$TRACES" --methods "$(variants "verify_cost=$STEEP")" --cost "$STEEP" \
  --out "$OUT/replay_steeper_curve"

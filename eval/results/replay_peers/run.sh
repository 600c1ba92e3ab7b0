#!/usr/bin/env bash
# ngramspec against every peer in cost-weighted replay of the 100 shared greedy traces and this
# project's 120 (eval/results/drafting), on three verify-cost curves (~2 minutes; SuffixDecoding
# needs .venv-vllm: `make setup-vllm`).
# Usage: bash eval/results/replay_peers/run.sh   (from the repository root)
# The tables here were made before the method names were unified (eval/methods.py) and name the
# methods as they were then: hf-rule = hf-pld, vllm-rule = ngram:min_n=1,max_n=4,k=5,
# suffix = suffix:cached=0, suffix-global = suffix. Rerun, every figure is the same.
set -euo pipefail
PY=${PYTHON:-.venv-vllm/bin/python}
TRACES=../shared/traces/smollm2_shared_greedy.jsonl
OUT=${OUT:-eval/results/replay_peers}
METHODS=${METHODS:-"hf-pld,ngram:min_n=1,max_n=4,k=5,suffix:cached=0,suffix,ngramspec,ngramspec:history_tokens=100000,truth-sized,oracle"}
# This CPU at 400 tokens of context (the default curve), at 2,000 (OnlineCost's prior there),
# and GUIDE.md's steeper 2-core curve.
CPU2K="1:1,2:1.29,3:1.38,4:1.63,5:1.71,6:1.76,8:1.93,10:2.1,12:2.17,16:2.16,24:2.38,32:2.65,48:3.97,64:5.3"
STEEP="1:1.0,2:1.1,3:1.17,4:1.6,8:1.94,11:2.3,16:2.45,32:2.9"
for traces in shared own; do
  if [ "$traces" = shared ]; then T=$TRACES; P=""; else T=eval/results/drafting/greedy_traces.jsonl; P=own_; fi
  "$PY" -m eval replay "$T" --methods "$METHODS" --out "$OUT/${P}cpu_400"
  "$PY" -m eval replay "$T" --methods "$METHODS" --cost "$CPU2K" --out "$OUT/${P}cpu_2000"
  "$PY" -m eval replay "$T" --methods "$METHODS" --cost "$STEEP" --out "$OUT/${P}steep"
done

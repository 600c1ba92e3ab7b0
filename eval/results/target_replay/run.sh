#!/usr/bin/env bash
# Issue 41's leads in replay with the target in the loop (eval/target.py): the default model's
# features from one teacher-forced forward per trace (cached under $STATES, ~3 min a trace set
# on 2 cores), then ngramspec with each lead and both, beside truth-sized and the oracle, on the
# 100 shared traces and this project's 120, on the three curves of ../replay_peers/run.sh.
# Usage: bash eval/results/target_replay/run.sh   (from the repository root)
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
STATES=${STATES:-/tmp/ngramspec-target-states}
OUT=eval/results/target_replay
METHODS="ngramspec,ngramspec+source,ngramspec+acceptance,ngramspec+source+acceptance,truth-sized,oracle"
CPU2K="1:1,2:1.29,3:1.38,4:1.63,5:1.71,6:1.76,8:1.93,10:2.1,12:2.17,16:2.16,24:2.38,32:2.65,48:3.97,64:5.3"
STEEP="1:1.0,2:1.1,3:1.17,4:1.6,8:1.94,11:2.3,16:2.45,32:2.9"
mkdir -p "$STATES"
for traces in shared own; do
  if [ "$traces" = shared ]; then T=../shared/traces/smollm2_shared_greedy.jsonl; P=""; else
    T=eval/results/drafting/greedy_traces.jsonl; P=own_; fi
  common=("$T" --model default --states "$STATES/$traces.npz" --quiet --methods "$METHODS")
  "$PY" -m eval replay "${common[@]}" --out "$OUT/${P}cpu_400" > /dev/null
  "$PY" -m eval replay "${common[@]}" --cost "$CPU2K" --out "$OUT/${P}cpu_2000" > /dev/null
  "$PY" -m eval replay "${common[@]}" --cost "$STEEP" --out "$OUT/${P}steep" > /dev/null
  echo "$traces done"
done

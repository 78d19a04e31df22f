#!/usr/bin/env bash
# Demo latency with each reader, one after the other on this machine (issue: "a reader that reads"):
#   bash eval/bench_demo_readers.sh            # writes eval/reports/demo/{reader,base}.json
# For each reader it starts vLLM (the trained reader, then the untrained SmolLM2 served under the reader's name so
# the demo's pipeline reaches it unchanged), starts `rag-mag serve`, asks 12 questions one at a time and 32 with 8
# in flight (eval/bench_demo_load.py), and stops both. Nothing else should run beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
R=.venv/bin/rag-mag
OUT=eval/reports/demo
mkdir -p "$OUT"
stop_all() { "$R" -q serve-llm --stop >/dev/null 2>&1 || true; [ -n "${DEMO:-}" ] && kill "$DEMO" 2>/dev/null || true; }
trap stop_all EXIT
for reader in reader base; do
  if [ "$reader" = base ]; then
    "$R" serve-llm --model artifacts/smollm2-135m-instruct --served-model-name smollm2-135m-reader
  else
    "$R" serve-llm
  fi
  "$R" serve --port 7861 >"$OUT/serve_$reader.log" 2>&1 & DEMO=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:7861/health >/dev/null 2>&1 && break; sleep 2; done
  .venv/bin/python eval/bench_demo_load.py --url http://127.0.0.1:7861 --baseline 12 --requests 32 \
      --concurrency 8 --json "$OUT/$reader.json" | tee "$OUT/$reader.txt"
  kill "$DEMO"; wait "$DEMO" 2>/dev/null || true; DEMO=
  "$R" serve-llm --stop
done

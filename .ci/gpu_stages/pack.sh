#!/usr/bin/env bash
# GPU stage "pack" (issue 30, section 2): runs per hour of small runs trained one at a time against several at once
# on the GPU (experiments/bench_pack.py: the sweep command on 6 LLaMA-shaped runs of one small budget, modes one /
# workers / groups, each with a cold compilation cache), and each packed run's losses against the same run alone.
# About 3 minutes. The caller has installed the wheels and set PYTHONPATH (.ci/gpu_check.sh). Output: $OUT/pack/
# (bench_pack.json, summary.txt, each mode's log, results.jsonl and metrics); the runs' checkpoints stay in
# /tmp/pack_work. Usage: OUT=DIR bash .ci/gpu_stages/pack.sh   (PACK_DEADLINE=seconds after which no mode starts)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_check}/pack"; WORK=/tmp/pack_work
mkdir -p "$OUT"; rm -rf "$WORK"
export TRANSFORMER_HUGE_PAGES=0 PYTHONUNBUFFERED=1 TFDS_DATA_DIR="${TFDS_DATA_DIR:-/tmp/tfds}"
unset XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_MEM_FRACTION  # one at a time: XLA's defaults; workers: their own
echo "== $(date +%T) pack: experiments.bench_pack --scale=device (deadline ${PACK_DEADLINE:-140} s)" | tee "$OUT/steps.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1
timeout "${PACK_SECONDS:-200}" python3 -m experiments.bench_pack --scale=device --out="$WORK" \
  --deadline_s="${PACK_DEADLINE:-140}" > "$OUT/bench_pack.json" 2> "$OUT/bench_pack.err"
echo "rc=$?" | tee -a "$OUT/steps.log"
for mode in one workers groups; do  # the small files of each mode (no checkpoints)
  [ -d "$WORK/$mode" ] || continue
  mkdir -p "$OUT/$mode"
  cp "$WORK/$mode.log" "$OUT/$mode/sweep.log" 2>/dev/null
  cp "$WORK/$mode/results.jsonl" "$WORK/$mode/sweep.json" "$OUT/$mode/" 2>/dev/null
  for run in "$WORK/$mode"/runs/*/; do
    r=$(basename "$run"); mkdir -p "$OUT/$mode/runs/$r"
    cp "$run"metrics.jsonl "$run"summary.json "$run"worker.log "$OUT/$mode/runs/$r/" 2>/dev/null
  done
done
python3 - "$OUT/bench_pack.json" "$(cat "$OUT/device.txt")" <<'PY' | tee "$OUT/summary.txt"
import json, sys
try:
    b = json.load(open(sys.argv[1]))
except Exception as e:  # the bench did not finish: say so, with its last lines
    print(f"pack: no result ({type(e).__name__}); see bench_pack.err"); sys.exit(0)
print(f"pack ({sys.argv[2]}; {b['dtype']}):")
for name, m in b["modes"].items():
    line = (f"  {name:8s} {m['runs']} runs ({m['ok']} ok) in {m['wall_seconds'] or float('nan'):.1f} s: "
            f"{m['runs_per_hour'] or 0:,.0f} runs/h")
    if "speedup" in m:
        l = m["losses"]
        line += (f", {m['speedup']:.2f}x one at a time; {m['workers']}; eval loss vs alone max "
                 f"{l['max_eval_rel_diff']:.2e} (tolerance {l['tolerance']:g}: {'ok' if l['within'] else 'NOT within'}), "
                 f"{l['bitwise_equal_runs']}/{len(l['runs'])} bitwise equal")
    print(line + f"; compile {m['compile_seconds']:.0f} s summed" + ("" if m["exit"] == 0 else f"; exit {m['exit']}"))
if b["skipped"]:
    print(f"  skipped (deadline): {', '.join(b['skipped'])}")
c = b.get("calibration") or {}
if c:
    print("  calibration (sweep.estimate_*): " + ", ".join(f"{k}={v:.4g}" for k, v in c.items() if isinstance(v, float)))
PY

#!/usr/bin/env bash
# Device stage: the gpu_quick IsoFLOP sweep end to end on one GPU (issue 30 §1; configs/sweeps/gpu_quick.py):
# its plan and estimate (the dry run, which refuses a plan over the sweep's 6 minutes), the token cache, the 13
# runs, the fit and the checked prediction, under one time limit. Called from the repo root, after the caller
# (.ci/gpu_check.sh) has installed the wheels and set PYTHONPATH:
#     OUT=DIR bash .ci/gpu_stages/gpu_quick.sh
# Everything lands in $OUT as three files (the device tool returns at most 8): gpu_quick.log (the console),
# gpu_quick_summary.txt (what it prints last, to paste: wall time, the fit's a, the prediction check, the measured
# rates that replace the config's estimates) and gpu_quick.tgz (the sweep directory: sweep.json, results.jsonl,
# fit/, every run's summary and metrics; the checkpoints left out).
# Settings (environment):
#   GPU_QUICK_CONFIG   the sweep config (default configs/sweeps/gpu_quick.py; configs/sweeps/gpu_quick.py:cpu is
#                      the same sweep shrunk for a CPU, what tests/test_gpu_quick.py runs this script with)
#   GPU_QUICK_FILES    data.files, comma-separated globs (default: .data/*.jsonl.gz, *.jsonl, *.txt, *.parquet where
#                      they exist, the folder carried to the device: docs/recipe-one-gpu.md; else the built-in corpus)
#   GPU_QUICK_SECONDS  the sweep's time limit (default 400: the 6 minutes with a margin, inside the stage's 8)
#   GPU_QUICK_ARGS     more config flags for prepare_data and the sweep (e.g. --config.base.data.cache_dir=DIR)
#   GPU_QUICK_PARALLEL the sweep's --parallel (default: the sweep's own default, 0: workers share the GPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$OUT"
CONFIG=${GPU_QUICK_CONFIG:-configs/sweeps/gpu_quick.py}
LIMIT=${GPU_QUICK_SECONDS:-400}
DIR="$OUT/gpu_quick"
LOG="$OUT/gpu_quick.log"
FILES=${GPU_QUICK_FILES:-}
if [[ -z $FILES ]]; then
  for g in .data/*.jsonl.gz .data/*.jsonl .data/*.txt .data/*.parquet; do
    compgen -G "$g" >/dev/null && FILES+="${FILES:+,}$PWD/$g"
  done
fi
ARGS=(--config="$CONFIG" ${FILES:+--config.base.data.files="$FILES"} ${GPU_QUICK_ARGS:-})
SWEEP=(${GPU_QUICK_PARALLEL:+--parallel=$GPU_QUICK_PARALLEL})
export PYTHONUNBUFFERED=1
: > "$LOG"
say() { echo "== $(date +%T) gpu_quick: $*" | tee -a "$LOG"; }
pack() {  # the sweep directory without its checkpoints, as one file
  [[ -d $DIR ]] || return 0
  tar czf "$OUT/gpu_quick.tgz" -C "$OUT" --exclude=checkpoints gpu_quick && rm -rf "$DIR"
}
trap pack EXIT

start=$(date +%s)
say "config $CONFIG, data ${FILES:-the built-in corpus}, limit ${LIMIT}s"
say "tokenizer and token cache (experiments.prepare_data)"
timeout 300 python3 -m experiments.prepare_data "${ARGS[@]}" >>"$LOG" 2>&1
rc=$?
if [[ $rc == 0 ]]; then
  say "plan and estimate (--dry_run: refuses a plan over sweep.max_hours)"
  python3 -m experiments.sweep "${ARGS[@]}" "${SWEEP[@]}" --workdir="$DIR" --dry_run 2>&1 | tee -a "$LOG" | grep -E "^(note|warning|error|epochs|time limit|total)"
  rc=${PIPESTATUS[0]}
fi
if [[ $rc == 0 ]]; then
  say "the sweep"
  timeout "$LIMIT" python3 -m experiments.sweep "${ARGS[@]}" "${SWEEP[@]}" --workdir="$DIR" 2>&1 | tee -a "$LOG" | grep -E "\] done |FAILED|DIVERGED|prediction|error|^approach|^fit"
  rc=${PIPESTATUS[0]}
fi
wall=$(( $(date +%s) - start ))
[[ $rc == 124 ]] && say "stopped at the limit of ${LIMIT}s; what is recorded is in gpu_quick.tgz (rerunning the stage on a warm machine resumes)"
python3 .ci/gpu_stages/gpu_quick_summary.py "$DIR" --wall="$wall" --rc="$rc" --limit="$LIMIT" 2>&1 | tee "$OUT/gpu_quick_summary.txt" | tee -a "$LOG"
exit "$rc"

#!/usr/bin/env bash
# The GPU check, the one prepared script for a lent GPU machine (issue 30 §4; BENCHMARKS.md, "GPU"), in stages
# ordered by value, each under its own time limit; everything lands in $OUT (default /tmp/gpu_check). Wheels for
# what the machine lacks (bash .ci/gpu_wheels.sh fills .whl/: ml-collections, grain, tensorflow-datasets, ...) are
# installed first; .data/ (bash .ci/gpu_data.sh), carried too, is the quick sweep's corpus. The machine's start takes a minute or more of a session's 15, and it goes back 30 s after a call:
#   call 1 (<= 8 min):  bash .ci/gpu_check.sh quick        the gpu_quick IsoFLOP sweep end to end (gpu_stages/)
#   call 2 (<= 4 min):  bash .ci/gpu_check.sh call2        runs per hour packed vs one at a time (gpu_stages/pack.sh),
#                                                          then the MFU bench matrix at 1B and GPT-2 small
# Other stages: decode (scanned decoding, attention registry), gpu (tests/test_gpu.py), suite (models, training,
# memory, interop on the GPU), bench (the MFU matrix alone), pack. Default: quick.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"
STAGES="${*:-quick}"
[[ $STAGES == *call2* ]] && STAGES="pack bench"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false TRANSFORMER_HUGE_PAGES=0 PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache TFDS_DATA_DIR=/tmp/tfds
log() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }
on_gpu() { JAX_PLATFORMS=cuda,cpu JAX_DEFAULT_MATMUL_PRECISION=highest "$@"; }  # f32 tests: full precision, not TF32
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
# Every module a run imports, before any stage: a missing one is one line here, not a failure per run.
python3 -c "import jax, flax, optax, orbax.checkpoint, grain, ml_collections, tensorflow_datasets, array_record, tensorboardX, sentencepiece, tokenizers, scipy, matplotlib, pyarrow; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tee -a "$OUT/device.txt"
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "error: a module the runs need does not import (above); add its wheel to .ci/gpu_wheels.sh"; exit 1; }
PYTEST="python3 -m pytest -q -p no:cacheprovider --timeout=150"

if [[ $STAGES == *quick* ]]; then
  log "quick: the gpu_quick sweep (gpu_stages/gpu_quick.sh)"
  OUT="$OUT" bash .ci/gpu_stages/gpu_quick.sh; echo "rc=$?"
fi
if [[ $STAGES == *pack* ]]; then
  log "pack: runs per hour, several runs on the GPU at once against one at a time (gpu_stages/pack.sh)"
  OUT="$OUT" PACK_DEADLINE="${PACK_DEADLINE:-90}" PACK_SECONDS="${PACK_SECONDS:-130}" bash .ci/gpu_stages/pack.sh
fi
if [[ $STAGES == *decode* ]]; then
  log "decode: scanned-layer decoding and the attention registry (jax 0.11 here)"
  on_gpu timeout 120 $PYTEST -n 8 tests/test_decoder.py tests/test_generation.py tests/test_attention_dispatch.py \
    2>&1 | tee "$OUT/decode.log" | tail -15
fi
if [[ $STAGES == *bench* ]]; then
  # The MFU matrix (issue 30 §3), each setting under its own limit, compilation included; every JSON carries mfu,
  # mfu_causal_half and memory_estimate_error (the estimator against the allocator's peak). Settings estimated above
  # ~55 GB need XLA_PYTHON_CLIENT_MEM_FRACTION (jax takes 75% by default). BENCH_SETTINGS="name|env|flags;..."
  # replaces the list.
  BENCH="python3 -m experiments.bench --json --steps=20"
  LLAMA="--config=configs/lm.py:llama_1b --config.model.vocab_size=32768 --config.data.seq_len=2048
    --config.train.compute_dtype=bfloat16 --config.model.attention_impl=cudnn --config.model.scan_layers=True"
  GPT2="--config=configs/lm.py:gpt2_small --config.data.seq_len=1024 --config.train.compute_dtype=bfloat16
    --config.model.scan_layers=True"
  SETTINGS=(
    "llama_b16_dnba_nochunk|XLA_PYTHON_CLIENT_MEM_FRACTION=0.95|$LLAMA --config.train.batch_size=16 --config.model.remat=dots_no_batch_attention --config.train.loss_chunk_size=0 --profile_dir=$OUT/prof_llama --profile_steps=3"
    "llama_b8_none|XLA_PYTHON_CLIENT_MEM_FRACTION=0.95|$LLAMA --config.train.batch_size=8 --config.model.remat=none --config.train.loss_chunk_size=512"
    "gpt2_b32|-|$GPT2 --config.train.batch_size=32 --profile_dir=$OUT/prof_gpt2 --profile_steps=3"
  )
  [[ -n ${BENCH_SETTINGS:-} ]] && IFS=';' read -ra SETTINGS <<< "$BENCH_SETTINGS"
  for setting in "${SETTINGS[@]}"; do
    IFS='|' read -r name envs flags <<< "$setting"
    [[ $envs == - ]] && envs=""
    log "bench $name: $envs $flags"
    env $envs timeout "${BENCH_SECONDS:-75}" $BENCH $flags > "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err"; echo "rc=$?"
    python3 - "$OUT/bench_$name.json" "$name" <<'PY'
import json, sys
try:
    b = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]}: no result ({type(e).__name__}); see its .err"); sys.exit(0)
prof = (b.get("profile") or {}).get("share") or {}
print(f"{sys.argv[2]}: {b['tokens_per_second']:,.0f} tok/s, step {b['step_seconds'] * 1e3:.0f} ms, MFU {b['mfu']:.1%} "
      f"(causal half {b.get('mfu_causal_half', float('nan')):.1%}), peak {b.get('memory_peak_bytes', 0) / 1e9:.1f} GB, "
      f"estimate error {b.get('memory_estimate_error', float('nan')):+.1%}, compile {b['compile_seconds']:.0f} s"
      + (", profile " + ", ".join(f"{k} {v:.0%}" for k, v in prof.items()) if prof else ""))
PY
    tail -2 "$OUT/bench_$name.err"
  done
fi
if [[ $STAGES == *gpu* ]]; then
  log "gpu: the GPU-only tests"
  JAX_PLATFORMS=cuda,cpu timeout 150 $PYTEST tests/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log" | tail -20
fi
if [[ $STAGES == *suite* ]]; then
  log "suite: models, training, memory, interop on the GPU (the 8-device tests left out: one GPU)"
  on_gpu timeout "${SUITE_SECONDS:-170}" $PYTEST -n 8 -k "not eight_devices and not another_mesh" \
    tests/test_layers.py tests/test_encoder.py tests/test_seq2seq.py tests/test_chunked_loss.py \
    tests/test_golden_step.py tests/test_grad_accum.py tests/test_memory.py tests/test_interop.py \
    tests/test_qk_norm.py tests/test_parallel_block.py tests/test_training.py 2>&1 | tee "$OUT/suite.log" | tail -25
fi
log "done"
# At most 8 files come back from the device: the summaries and logs stay, everything else in one archive.
( cd "$OUT" && rest=$(find . -mindepth 1 -maxdepth 1 ! -name steps.log ! -name device.txt ! -name '*summary.txt' \
    ! -name '*.tgz' ! -name gpu_quick.log -printf '%P\n') && [[ -n $rest ]] && tar czf files.tgz $rest && rm -rf $rest )
ls "$OUT"

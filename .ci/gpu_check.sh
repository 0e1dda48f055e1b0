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
  BENCH="python3 -m experiments.bench --json --steps=20"
  LLAMA="--config=configs/lm.py:llama_1b --config.model.vocab_size=32768 --config.data.seq_len=2048
    --config.train.compute_dtype=bfloat16 --config.model.attention_impl=cudnn --config.model.scan_layers=True
    --config.train.loss_chunk_size=512"
  # the MFU matrix (issue 30 §3): remat policies and batch, each setting under 60 s (compilation included)
  SETTINGS=("dots_no_batch_attention 8" "dots_no_batch 8" "dots_no_batch_attention 16")
  [[ -n ${BENCH_SETTINGS:-} ]] && IFS=, read -ra SETTINGS <<< "$BENCH_SETTINGS"  # e.g. "none 8,full 16"
  for setting in "${SETTINGS[@]}"; do
    read -r r b <<< "$setting"
    log "bench llama_1b remat=$r batch=$b"
    timeout 60 $BENCH $LLAMA --config.model.remat=$r --config.train.batch_size=$b \
      > "$OUT/bench_llama_1b_${r}_$b.json" 2> "$OUT/bench_llama_1b_${r}_$b.err"; echo "rc=$?"
    cat "$OUT/bench_llama_1b_${r}_$b.json"; tail -3 "$OUT/bench_llama_1b_${r}_$b.err"
  done
  log "bench gpt2_small seq 1024 batch 16 bf16 (auto attention)"
  timeout 90 $BENCH --config=configs/lm.py:gpt2_small --config.data.seq_len=1024 --config.train.batch_size=16 \
    --config.train.compute_dtype=bfloat16 > "$OUT/bench_gpt2_small.json" 2> "$OUT/bench_gpt2_small.err"; echo "rc=$?"
  cat "$OUT/bench_gpt2_small.json"; tail -3 "$OUT/bench_gpt2_small.err"
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

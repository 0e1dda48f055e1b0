#!/usr/bin/env bash
# The GPU check, one short script for a lent GPU machine (BENCHMARKS.md, "GPU"): a selection of the default
# suite on the GPU, the bench at the GPU target shape (three memory/remat settings) and at GPT-2 small, and
# the GPU-only tests (tests/test_gpu.py). Each stage has its own time limit; everything lands in $OUT
# (default /tmp/gpu_check). Wheels for what the machine lacks (ml-collections, grain, tensorflow-datasets,
# ...) in .whl/ are installed first. Stages: bash .ci/gpu_check.sh [decode] [bench] [gpu] [suite] (default all).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"
STAGES="${*:-decode bench gpu suite}"
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
python3 -c "import jax, flax, optax, orbax.checkpoint, grain, ml_collections; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tee -a "$OUT/device.txt"
PYTEST="python3 -m pytest -q -p no:cacheprovider --timeout=150"

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
  for setting in "dots_no_batch 8" "none 8" "dots_no_batch 16"; do
    set -- $setting
    log "bench llama_1b remat=$1 batch=$2"
    timeout 150 $BENCH $LLAMA --config.model.remat=$1 --config.train.batch_size=$2 \
      > "$OUT/bench_llama_1b_$1_$2.json" 2> "$OUT/bench_llama_1b_$1_$2.err"; echo "rc=$?"
    cat "$OUT/bench_llama_1b_$1_$2.json"; tail -3 "$OUT/bench_llama_1b_$1_$2.err"
  done
  log "bench gpt2_small seq 1024 batch 16 bf16 (auto attention)"
  timeout 100 $BENCH --config=configs/lm.py:gpt2_small --config.data.seq_len=1024 --config.train.batch_size=16 \
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

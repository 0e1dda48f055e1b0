#!/usr/bin/env bash
# The lab note's commands (2026-11-27-lora-and-head-pruning.md), in order, from the repository root.
set -euo pipefail
LAB=runs/lab
SHAPE="--config.model.num_layers=4 --config.model.num_heads=4 --config.data.seq_len=128 --config.train.batch_size=32"
CLS="--config=configs/mlm.py:default,classify $SHAPE --config.train.steps=300 --config.train.eval_every=100 --config.train.eval_steps=16 --config.train.log_every=50 --config.train.init_from=$LAB/mlm"
ALL=query,key,value,out,mlp_in,mlp_out
# the BERT-shaped masked LM everything starts from
python -m experiments.train --config=configs/mlm.py:default --workdir=$LAB/mlm $SHAPE --config.train.steps=1000 \
    --config.train.log_every=100 --config.train.eval_every=500 --config.train.checkpoint_every=500
# full fine-tuning, then LoRA at ranks 4, 8, 16 (and 8 at the full run's learning rate)
python -m experiments.train $CLS --workdir=$LAB/cls_full
for r in 4 8 16; do
  python -m experiments.train $CLS --workdir=$LAB/cls_lora$r --config.model.lora.rank=$r --config.model.lora.targets=$ALL \
      --config.train.learning_rate=3e-3
done
python -m experiments.train $CLS --workdir=$LAB/cls_lora8_lr1e-3 --config.model.lora.rank=8 --config.model.lora.targets=$ALL
# head importance, the pruning suggestion at 37.5%, the curves (importance vs three random orders)
python -m experiments.heads --workdir=$LAB/cls_full --batches=16 --prune=0.375 \
    --curve=0,0.0625,0.125,0.1875,0.25,0.3125,0.375,0.4375,0.5,0.5625,0.625,0.6875,0.75
for s in 1 2; do
  python -m experiments.heads --workdir=$LAB/cls_full --batches=16 --out=$LAB/heads_seed$s --seed=$s \
      --curve=0,0.125,0.25,0.375,0.5,0.625,0.75
done
# the pruned model for real: as pruned (one step at lr 1e-12), and fine-tuned 100 steps at 1e-3 and at 1e-4
P="$(cat $LAB/cls_full/heads/pruned_heads.json)"
python -m experiments.train $CLS --workdir=$LAB/cls_pruned_step0 --config.train.init_from=$LAB/cls_full \
    --config.train.steps=1 --config.train.warmup_steps=0 --config.train.learning_rate=1e-12 --config.model.pruned_heads="$P"
python -m experiments.train $CLS --workdir=$LAB/cls_pruned --config.train.init_from=$LAB/cls_full \
    --config.train.steps=100 --config.train.eval_every=50 --config.model.pruned_heads="$P"
python -m experiments.train $CLS --workdir=$LAB/cls_pruned_lr1e-4 --config.train.init_from=$LAB/cls_full \
    --config.train.steps=100 --config.train.eval_every=50 --config.train.learning_rate=1e-4 --config.model.pruned_heads="$P"
# step times and XLA's memory, configurations alternating round by round in one process
PYTHONPATH=. python docs/figures/lora_heads/step_times.py lora 12
PYTHONPATH=. python docs/figures/lora_heads/step_times.py pruned 12

"""Attention-head importance of a training run (Michel et al. 2019), the heads to prune, the pruning curve.

python -m experiments.heads --workdir=RUN [--out=DIR] [--batches=K] [--step=S] [--prune=F]
                            [--curve=0,0.1,...] [--seed=S]

Over K evaluation batches of the run's eval split (default train.eval_steps), the importance of every head of
every attention layer (self- and cross-attention): the mean over batches of |∂L/∂ξ_h|, ξ a head mask
(transformer/training/heads.py). Writes into DIR (default RUN/heads, beside where experiments.attention puts its
maps when given --out=RUN/heads):
  importance.json   step, batches, layers (module paths, in order), heads per layer, importance and normalized
                    (each layer's scores over their L2 norm) per layer, and `order`: [layer, head] least important
                    first
  importance.csv    layer, head, importance, normalized
  heads.png         the normalized importance as a layers × heads heat map
  --prune=F         pruned_heads.json: the model.pruned_heads that removes the fraction F of the heads (whole
                    groups under grouped-query attention) least important, one staying in every layer; the command
                    line that trains the pruned model from RUN is printed
  --curve=FRACTIONS curve.json, curve.png: eval loss and accuracy against the fraction removed, by importance
                    (recomputed after each step) and in a random order (--seed)
Bad flags (a fraction outside what can be pruned, no checkpoint) are one `error:` line before anything is written.
"""
from __future__ import annotations

import csv
import json
import os

import numpy as np
from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from experiments.jax_setup import setup_jax
from transformer.spec import ConfigError

_WORKDIR = DEFINE_path("workdir", None, "Training run directory (config.json + checkpoints/).")
_OUT = DEFINE_path("out", None, "Output directory (default: WORKDIR/heads).")
_BATCHES = flags.DEFINE_integer("batches", 0, "Evaluation batches to accumulate over (0: train.eval_steps).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_PRUNE = flags.DEFINE_float("prune", None, "Write pruned_heads.json removing this fraction of the heads.")
_CURVE = flags.DEFINE_list("curve", [], "Fractions of heads removed for the pruning curve, e.g. 0,0.1,0.2.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random pruning order (--curve).")


def _fractions(values: list[str], limit: float) -> list[float]:
    try:
        out = sorted(float(v) for v in values)
    except ValueError:
        raise ConfigError(f"--curve={','.join(values)} must be comma-separated fractions") from None
    if out and not (0 <= out[0] and out[-1] <= limit + 1e-9):
        raise ConfigError(f"--curve={','.join(values)}: fractions in [0, {limit:.3g}] (one head, or group, stays in "
                          f"every layer)")
    return out


def heat_map(scores: dict[str, np.ndarray], layers: list[str], title: str, path: str) -> None:
    """Layers (rows, in order) × heads (columns) of `scores`; a pruned layer's missing heads blank."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(len(scores[k]) for k in layers)
    grid = np.full((len(layers), width), np.nan)
    for i, k in enumerate(layers):
        grid[i, :len(scores[k])] = scores[k]
    fig, ax = plt.subplots(figsize=(4.2 + 0.5 * width, 1.6 + 0.4 * len(layers)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(width))
    ax.set_yticks(range(len(layers)), labels=layers, fontsize=7)
    ax.set_xlabel("head")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="importance / layer's L2 norm")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def curve_plot(curves: dict[str, list[dict]], title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for order, rows in curves.items():
        for ax, key in zip(axes, ("accuracy", "loss")):
            ax.plot([r["fraction"] for r in rows], [r[key] for r in rows], "o-" if order == "importance" else "s--",
                    label=order)
    for ax, key in zip(axes, ("eval accuracy", "eval loss")):
        ax.set_xlabel("fraction of heads removed")
        ax.set_ylabel(key)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    del argv
    setup_jax()
    import jax.numpy as jnp

    from transformer.spec import pruning
    from transformer.tasks import get_task
    from transformer.training import heads
    from transformer.training.restore import load_run

    run = load_run(_WORKDIR.value, step=_STEP.value)
    cfg, spec = run.model_cfg, run.spec
    limit = heads.max_fraction(cfg)
    if _PRUNE.value is not None and not 0 < _PRUNE.value <= limit + 1e-9:
        raise ConfigError(f"--prune={_PRUNE.value}: a fraction in (0, {limit:.3g}] (one head, or group, stays in "
                          f"every layer)")
    fractions = _fractions(_CURVE.value, limit)
    count = _BATCHES.value or spec.train.eval_steps
    if count < 1:
        raise ConfigError(f"--batches={_BATCHES.value} must be positive")
    out = _OUT.value or os.path.join(_WORKDIR.value, "heads")
    os.makedirs(out, exist_ok=True)  # an unwritable place fails here, before the gradients are computed
    task = get_task(spec)
    it = task.make_iterator(spec, split=spec.data.eval_split, global_batch_size=spec.train.batch_size,
                            seed=spec.data.shuffle_seed, process_index=0, process_count=1, shuffle=True, repeat=True)
    batches = [{k: jnp.asarray(v) for k, v in next(it).items()} for _ in range(count)]
    scores = heads.importance(run.model, task, run.params, batches)
    norm = heads.normalized(scores)
    layers = pruning.attention_paths(cfg)
    order = sorted(((k, h) for k in layers for h in range(len(norm[k]))), key=lambda kh: float(norm[kh[0]][kh[1]]))
    table = {"workdir": _WORKDIR.value, "step": run.step, "batches": count, "layers": layers,
             "heads": {k: len(scores[k]) for k in layers}, "pruned_heads": cfg.pruned_heads,
             "importance": {k: scores[k].tolist() for k in layers}, "normalized": {k: norm[k].tolist() for k in layers},
             "order": [[k, h] for k, h in order]}
    with open(os.path.join(out, "importance.json"), "w") as f:
        json.dump(table, f, indent=1)
    with open(os.path.join(out, "importance.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layer", "head", "importance", "normalized"])
        for k in layers:
            w.writerows([k, h, float(scores[k][h]), float(norm[k][h])] for h in range(len(scores[k])))
    heat_map(norm, layers, f"head importance, {os.path.basename(os.path.normpath(_WORKDIR.value))} step {run.step}",
             os.path.join(out, "heads.png"))
    print(os.path.join(out, "importance.json"))
    print(os.path.join(out, "heads.png"))
    if _PRUNE.value is not None:
        pruned = heads.prune_by_importance(cfg, scores, _PRUNE.value)
        with open(os.path.join(out, "pruned_heads.json"), "w") as f:
            json.dump(pruned, f)
        print(f"train the pruned model from this run with --config.train.init_from={_WORKDIR.value} "
              f"--config.model.pruned_heads='{json.dumps(pruned, separators=(',', ':'))}'")
    if fractions:
        curves = {o: heads.pruning_curve(run.model, task, run.params, batches, fractions, order=o, seed=_SEED.value)
                  for o in ("importance", "random")}
        with open(os.path.join(out, "curve.json"), "w") as f:
            json.dump(curves, f, indent=1)
        curve_plot(curves, f"pruning {os.path.basename(os.path.normpath(_WORKDIR.value))} ({count} eval batches)",
                   os.path.join(out, "curve.png"))
        for o, rows in curves.items():
            print(o, " ".join(f"{r['fraction']:.2f}:{r['accuracy']:.3f}/{r['loss']:.3f}" for r in rows))
        print(os.path.join(out, "curve.json"))


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)

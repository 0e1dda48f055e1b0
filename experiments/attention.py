"""Attention heatmaps of a training run's latest checkpoint for one input text.

python -m experiments.attention --workdir=DIR --text=TEXT --out=OUTDIR [--layers=0,2 --heads=0,1 --step=S]

Writes OUTDIR/<module path>.png for each selected attention layer (a grid of heads; rows are
queries, columns keys, labelled with the tokens; e.g. blocks_layers_0_attention.png) and
OUTDIR/attention.npz with the raw weights (one weights_NTS array per layer, plus `tokens`).
A bos token is put before the text, as in training.
"""
from __future__ import annotations

import os

import numpy as np
from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from experiments.jax_setup import setup_jax
from transformer.spec import ConfigError

_WORKDIR = DEFINE_path("workdir", None, "Training run directory (config.json + checkpoints/).")
_TEXT = flags.DEFINE_string("text", None, "Input text.")
_OUT = DEFINE_path("out", None, "Output directory for the PNGs and attention.npz.")
_LAYERS = flags.DEFINE_list("layers", [], "Layer indices to plot (default: all).")
_HEADS = flags.DEFINE_list("heads", [], "Head indices to plot (default: all).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
MAX_TOKENS = 128


def _indices(name: str, values: list[str]) -> list[int] | None:
    if not values:
        return None
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ConfigError(f"--{name}={','.join(values)} must be comma-separated integers") from None


def main(argv: list[str]) -> None:
    del argv
    setup_jax()
    from transformer.inference.attention_maps import attention_maps, layer_index, plot_attention, token_labels
    from transformer.training.restore import load_run

    layers, heads = _indices("layers", _LAYERS.value), _indices("heads", _HEADS.value)
    run = load_run(_WORKDIR.value, step=_STEP.value)
    if run.model_cfg.family != "decoder":
        raise ConfigError(f"experiments.attention reads decoder-only runs; this run's model.family is "
                          f"{run.model_cfg.family!r}")
    tok = run.tokenizer
    ids = [tok.bos_id] + tok.encode(_TEXT.value).tolist()
    if len(ids) > min(MAX_TOKENS, run.model_cfg.max_len):
        raise ConfigError(f"--text is {len(ids)} tokens with bos; at most {min(MAX_TOKENS, run.model_cfg.max_len)} "
                          "fit a readable heatmap")
    maps = attention_maps(run.model, run.params, np.asarray([ids], np.int32))
    num_layers = len(maps)
    if layers is not None and any(not 0 <= i < num_layers for i in layers):
        raise ConfigError(f"--layers={_LAYERS.value} out of range; the model has layers 0..{num_layers - 1}")
    if heads is not None and any(not 0 <= h < run.model_cfg.num_heads for h in heads):
        raise ConfigError(f"--heads={_HEADS.value} out of range; the model has heads 0..{run.model_cfg.num_heads - 1}")
    labels = token_labels(tok, ids)
    os.makedirs(_OUT.value, exist_ok=True)
    for name, weights_BNTS in maps.items():
        if layers is not None and layer_index(name) not in layers:
            continue
        path = os.path.join(_OUT.value, name.replace("/", "_") + ".png")
        plot_attention(weights_BNTS[0], labels, labels, f"{name} (step {run.step})", path, heads)
        print(path)
    np.savez(os.path.join(_OUT.value, "attention.npz"), tokens=np.asarray(ids, np.int32),
             **{name.replace("/", "_"): w[0] for name, w in maps.items()})
    print(os.path.join(_OUT.value, "attention.npz"))


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir", "text", "out"])
    cli.run(main)

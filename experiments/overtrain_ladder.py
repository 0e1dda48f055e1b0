"""The over-training ladder: a few model sizes, each trained at 5, 10, 20, ... tokens per parameter, on the CPU.

  python -m experiments.overtrain_ladder --out=FILE.csv --workdir=DIR [--d_models=24,32,48,64,80]
      [--max_tokens_per_param=640,640,160,40,20] [--tokens_per_param=5,10,20,40,80,160,320,640] [--seed=0]
      [--plot=FILE.png]

The defaults make the shipped ladder (experiments/reference_data/overtrain_ladder_cpu.csv; docs/results/
2026-11-27-overtrain-ladder.md): five sizes, N = 2.4e4–1.9e5, the larger ones stopping earlier (about an hour of
two CPU cores). Reference data for the loss at any (N, D) (`transformer/scaling/at_points.py`): how the loss of
one model size goes on falling as it is trained far past compute-optimal. Each size is ONE warm-up–stable–decay
run on its own workdir (DIR/<shape>), trained first to the fewest tokens per parameter, then continued to each next count with
the mechanism a wsd run already has (`experiments.train` on its workdir with a larger `train.steps`: it resumes
from the kept decay-start checkpoint, sets the old decay aside in superseded_checkpoints/, and ends like the
longer run trained from step 0; docs/sweeps.md "Warm-up–stable–decay branches"). So a size costs its longest
branch plus the decays, and every branch's final evaluation (summary.json, read before the next continuation
supersedes it) is one row of the CSV.

The runs follow the `cpu` sweep's rules (`--config`, default configs/sweeps/cpu.py; `transformer/design/grid.py`):
its shapes (GPT-2 blocks, depth 2, head_dim 8, d_ff = 4·d), its batch (8 × 128 tokens), AdamW β2 = 0.99, a
20% "1−sqrt" cooldown to 0, a warm-up of N tokens (at least 20 steps) shared by every branch of a size, and the
learning rate c·N^−0.5 with c = `--lr_coefficient` (1.40, the cpu sweep's calibration,
docs/results/2026-11-24-cpu-sweep.md). N is the total parameter count, D the tokens trained on.

CSV columns (one row per branch, written after each branch, so an interrupted ladder keeps what it has and a
rerun of the same command goes on from there): size, d_model, num_layers, params, params_non_embedding, tokens,
tokens_per_param, flops (the training loop's accounting, attention included), loss (final eval loss, nats per
byte token), bits_per_byte, seed, epochs (passes over the training split), steps, learning_rate, warmup_steps,
seconds (the branch's wall time). A branch that would read the training split more than `--max_epochs` times is
refused before anything trains. Stopped by SIGTERM, the run in progress checkpoints and the command exits 3; the
same command goes on from there.
"""
from __future__ import annotations

import csv
import math
import os
import sys
import time
from typing import Any

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments._paths import DEFINE_path

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sweeps/cpu.py",
                                          "The sweep config whose rules the ladder's runs follow.")
_OUT = DEFINE_path("out", None, "The CSV written (one row per branch).")
_WORKDIR = DEFINE_path("workdir", None, "Directory of the runs: one workdir per size, DIR/<shape>.")
_D_MODELS = flags.DEFINE_list("d_models", ["24", "32", "48", "64", "80"], "Widths of the ladder's sizes.")
_MAX_TPP = flags.DEFINE_list("max_tokens_per_param", ["640", "640", "160", "40", "20"],
                             "The most tokens per parameter each size is trained to (one value, or one per size).")
_TPP = flags.DEFINE_list("tokens_per_param", ["5", "10", "20", "40", "80", "160", "320", "640"],
                         "The branches: tokens per parameter, increasing.")
_SEED = flags.DEFINE_integer("seed", 0, "train.seed of every run.")
_LR_COEFFICIENT = flags.DEFINE_float("lr_coefficient", 1.40, "Peak learning rate = this · N^sweep.lr_exponent.")
_PLOT = DEFINE_path("plot", None, "Also draw the CSV: loss against tokens per parameter, one line per size (PNG).")
_MAX_EPOCHS = flags.DEFINE_float("max_epochs", 4.0, "Refuse a branch that reads the training split more often.")

COLUMNS = ("size", "d_model", "num_layers", "params", "params_non_embedding", "tokens", "tokens_per_param", "flops",
           "loss", "bits_per_byte", "seed", "epochs", "steps", "learning_rate", "warmup_steps", "seconds")


def _numbers(values: list[str], name: str, kind: type = float) -> list[Any]:
    from transformer.spec import ConfigError
    try:
        out = [kind(v) for v in values]
    except ValueError:
        raise ConfigError(f"--{name}={','.join(values)}: give comma-separated numbers") from None
    if not out or any(not (math.isfinite(v) and v > 0) for v in out):
        raise ConfigError(f"--{name}={','.join(values)}: every value must be a positive number")
    return out


def plan(config: Any, d_models: list[int], max_tpp: list[float], tpp: list[float], seed: int,
         lr_coefficient: float) -> list[dict[str, Any]]:
    """Per size {"shape", "params", "params_non_embedding", "branches": [(tokens_per_param, run config)]}: the
    cpu sweep's shape, learning rate and warm-up rules (grid.py), one warm-up for every branch of a size."""
    from transformer.design import grid
    from transformer.design.spec import SweepSpec, plain
    from transformer.spec import ConfigError
    if tpp != sorted(set(tpp)):
        raise ConfigError(f"--tokens_per_param={','.join(f'{t:g}' for t in tpp)}: must increase (each branch "
                          "continues the one before)")
    if len(max_tpp) not in (1, len(d_models)):
        raise ConfigError(f"--max_tokens_per_param: give one value or one per size ({len(d_models)}), got "
                          f"{len(max_tpp)}")
    spec = SweepSpec.of(config)
    if spec.base["train"]["schedule"] != "wsd":
        raise ConfigError(f"--config: base.train.schedule={spec.base['train']['schedule']!r}; the ladder's branches "
                          "continue a wsd run from its decay start: use a config with base.train.schedule='wsd'")
    base, vocab = plain(spec.base), grid.vocab_size(spec.base)
    base["train"]["seed"] = seed
    batch, seq = base["train"]["batch_size"], base["data"]["seq_len"]
    out = []
    for d_model, top in zip(d_models, max_tpp * len(d_models) if len(max_tpp) == 1 else max_tpp):
        shape = grid.shape_for(spec, d_model)
        probe = grid.run_config(base, spec, shape, vocab)
        m = grid.measure(probe, vocab)
        n = int(m["params"])
        lr = float(f"{min(spec.lr_max, lr_coefficient * n ** spec.lr_exponent):.4g}")
        mine = [t for t in tpp if t <= top * (1 + 1e-9)]
        if not mine:
            raise ConfigError(f"--max_tokens_per_param={top:g} for d_model={d_model} is below every branch "
                              f"(--tokens_per_param starts at {tpp[0]:g})")
        steps_B = [max(1, round(t * n / (batch * seq))) for t in mine]
        warmup = grid.warmup_for(spec, steps_B[0], n, batch * seq)
        branches = []
        for t, steps in zip(mine, steps_B):
            cfg = grid.run_config(base, spec, shape, vocab, steps, lr, batch, n)
            cfg["train"]["warmup_steps"] = warmup
            branches.append((t, cfg))
        out.append({"shape": shape, "params": n, "params_non_embedding": int(m["params_non_embedding"]),
                    "learning_rate": lr, "warmup_steps": warmup, "branches": branches})
    return out


def check_epochs(sizes: list[dict[str, Any]], max_epochs: float) -> float:
    """The training split's tokens (the token cache, built here if missing); ConfigError naming the first branch
    that would read it more than `max_epochs` times."""
    from transformer.data import token_cache, tokenizers
    from transformer.spec import ConfigError, DataSpec
    data = DataSpec.of(sizes[0]["branches"][0][1]["data"])
    split = token_cache.read_meta(token_cache.ensure_cache(data, tokenizers.get_tokenizer(data), verbose=False))
    tokens = int(split["train"]["tokens"])
    for size in sizes:
        for t, cfg in size["branches"]:
            train = cfg["train"]
            epochs = train["steps"] * train["batch_size"] * (cfg["data"]["seq_len"] + 1) / tokens
            if epochs > max_epochs:
                raise ConfigError(f"{size['shape'].name} at {t:g} tokens per parameter reads the training split "
                                  f"{epochs:.2f} times > --max_epochs={max_epochs:g}: lower its "
                                  "--max_tokens_per_param, or train on more data (data.files)")
    return tokens


def read_rows(path: str) -> list[dict[str, str]]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def row_of(size: dict[str, Any], summary: dict[str, Any], seed: int, seconds: float) -> dict[str, Any]:
    """The CSV row of a branch's finished summary.json."""
    n = summary["params"]
    return {"size": size["shape"].name, "d_model": size["shape"].d_model, "num_layers": size["shape"].num_layers,
            "params": n, "params_non_embedding": summary["params_non_embedding"], "tokens": summary["tokens"],
            "tokens_per_param": f"{summary['tokens'] / n:.4g}", "flops": f"{summary['flops']:.6g}",
            "loss": f"{summary['eval_loss']:.6f}", "bits_per_byte": f"{summary['eval_bits_per_byte']:.6f}",
            "seed": seed, "epochs": f"{summary['epochs']:.4f}", "steps": summary["steps"],
            "learning_rate": size["learning_rate"], "warmup_steps": size["warmup_steps"], "seconds": f"{seconds:.1f}"}


def run_ladder(sizes: list[dict[str, Any]], workdir: str, out: str, seed: int) -> list[dict[str, Any]]:
    """Trains every branch not yet in `out` (size and steps), in order, appending its row after it finishes."""
    from transformer.spec import ConfigError
    from transformer.training.loop import train
    rows: list[dict[str, Any]] = read_rows(out)
    done = {(r["size"], int(r["steps"])) for r in rows}
    for size in sizes:
        run_dir = os.path.join(workdir, size["shape"].name)
        for t, cfg in size["branches"]:
            if (size["shape"].name, cfg["train"]["steps"]) in done:
                continue
            t0 = time.time()
            summary = train(cfg, run_dir, verbose=False)
            if summary.get("status") == "preempted":  # SIGTERM: checkpointed; the same command goes on from there
                print(f"stopped in {run_dir} at {t:g} tokens per parameter (step {summary.get('step')}): rerun the "
                      f"same command to go on; the rows so far are in {out}", flush=True)
                sys.exit(3)
            if summary.get("status") != "ok" or summary.get("eval_loss") is None:
                raise ConfigError(f"{run_dir} at {t:g} tokens per parameter ended {summary.get('status')!r} "
                                  f"({summary.get('error')}); its rows so far are in {out}")
            rows.append(row_of(size, summary, seed, time.time() - t0))
            write_rows(out, rows)
            print(f"{size['shape'].name} N={size['params']:,} {t:g} tokens/param: loss {summary['eval_loss']:.4f} "
                  f"({summary['epochs']:.2f} epochs, {time.time() - t0:.0f} s)", flush=True)
    return rows


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Loss (and the compute-optimal region's tokens per parameter) against tokens per parameter, per size."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for size in dict.fromkeys(r["size"] for r in rows):
        mine = [r for r in rows if r["size"] == size]
        ax.plot([float(r["tokens_per_param"]) for r in mine], [float(r["loss"]) for r in mine], "o-",
                label=f"{size} (N = {int(mine[0]['params']):,})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per parameter (D / N)")
    ax.set_ylabel("final eval loss (nats per byte)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
    ax.set_title("CPU over-training ladder (one wsd run per size)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    from transformer.spec import ConfigError
    del argv
    if not _OUT.value or not _WORKDIR.value:
        raise ConfigError("--out=FILE.csv and --workdir=DIR are required")
    sizes = plan(_CONFIG.value, _numbers(_D_MODELS.value, "d_models", int), _numbers(_MAX_TPP.value,
                 "max_tokens_per_param"), _numbers(_TPP.value, "tokens_per_param"), _SEED.value,
                 _LR_COEFFICIENT.value)
    from experiments.jax_setup import setup_jax
    setup_jax()
    check_epochs(sizes, _MAX_EPOCHS.value)
    for s in sizes:
        print(f"{s['shape'].name}: N={s['params']:,} ({s['params_non_embedding']:,} non-embedding), lr "
              f"{s['learning_rate']:.4g}, warm-up {s['warmup_steps']} steps, branches at "
              f"{', '.join(f'{t:g}' for t, _ in s['branches'])} tokens/param", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    rows = run_ladder(sizes, _WORKDIR.value, _OUT.value, _SEED.value)
    if _PLOT.value:
        plot(rows, _PLOT.value)


if __name__ == "__main__":
    cli.run(main)

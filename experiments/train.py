"""Train a model: python -m experiments.train --config=configs/lm.py[:PRESET] --workdir=DIR [--config.KEY=V].

Rerunning the same command on the same DIR resumes from its latest checkpoint. --dry_run prints the resolved
config (what DIR/config.json would hold), the model's size and the mesh after every check a real run makes
before reading data, and exits without training or writing anything (--workdir optional). Relative paths
(--workdir, data.files, data.tokenizer, data.cache_dir, train.init_from) are relative to the current directory
and recorded absolute (experiments/_paths.py). The Train contract
(files and their keys) is in docs/design.md.
"""
from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments._paths import DEFINE_path, absolute_config
from experiments.jax_setup import setup_jax
from transformer.spec import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:llama_tiny.")
_WORKDIR = DEFINE_path("workdir", None, "Run directory: config, metrics, checkpoints, summary.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config, model size and mesh; train nothing, "
                             "write nothing.")


def dry_run(config: Any, workdir: str | None) -> None:
    """Resolves and checks `config` as `train` does, prints it, and says what a real run on `workdir` would do."""
    import jax

    from transformer.data import tokenizers
    from transformer.spec import flops_per_token, param_counts
    from transformer.training import sharding
    from transformer.training.run_io import check_workdir_config
    from transformer.training.resolve import keep_recorded_warmup, resolve

    warmup = None
    if workdir:  # as the real run: train.warmup_steps=-1 on a workdir that holds a run keeps that run's warm-up
        config, warmup = keep_recorded_warmup(config, workdir)
    tokenizer, note = None, None
    if config.data.tokenizer == "sentencepiece" and not os.path.exists(tokenizers.sentencepiece_path(config.data)):
        tokenizer = types.SimpleNamespace(vocab_size=config.data.vocab_size)  # what training it would give
        note = (f"the SentencePiece model is not trained yet: the first real run trains data.vocab_size="
                f"{config.data.vocab_size} pieces into {tokenizers.sentencepiece_path(config.data)}")
    run = resolve(config, jax.device_count(), jax.process_count(), tokenizer)
    if workdir:
        check_workdir_config(workdir, json.loads(json.dumps(run.config)))  # read-only: a conflict is an error
    print(json.dumps(run.config, indent=2, sort_keys=True))
    counts = param_counts(run.model_cfg)
    fpt = flops_per_token(run.model_cfg, config.data.seq_len)["training"]
    tokens = config.train.steps * config.train.batch_size * config.data.seq_len
    trained = f", {counts['trainable']:,} trained (LoRA)" if run.model_cfg.lora.rank else ""
    print(f"model: {counts['total']:,} parameters ({counts['non_embedding']:,} non-embedding{trained}); "
          f"{fpt / 1e6:.2f} MFLOP/token; {config.train.steps} steps x {config.train.batch_size} x "
          f"{config.data.seq_len} = {tokens:,} tokens, {tokens * fpt:.3g} FLOPs")
    print(f"mesh: {dict(zip(sharding.MESH_AXES, run.mesh_shape))} over {jax.device_count()} "
          f"{jax.devices()[0].platform} devices")
    if note:
        print(f"note: {note}")
    if warmup is not None:
        print(f"note: keeping the warm-up the workdir's run resolved, {warmup} steps (train.warmup_steps=-1)")
    if workdir:
        resumes = os.path.exists(os.path.join(workdir, "config.json"))
        print(f"workdir: {workdir} ({'holds this run: a real run resumes it' if resumes else 'a new run'})")
    print("dry run: nothing trained, nothing written")


def main(argv: list[str]) -> None:
    del argv
    if not _DRY_RUN.value and not _WORKDIR.value:
        raise ConfigError("--workdir=DIR is required (the run directory; optional only with --dry_run)")
    config = absolute_config(_CONFIG.value)  # relative data files, tokenizer, init_from: from this directory
    setup_jax(config)
    if _DRY_RUN.value:
        return dry_run(config, _WORKDIR.value)
    from transformer.training.loop import train  # after JAX's distributed/compilation-cache set-up
    import transformer.interop.hf_warm_start  # noqa: F401  train.init_from may name a Hugging Face checkpoint
    try:
        summary = train(config, _WORKDIR.value)
    except FloatingPointError as e:  # train.nonfinite="stop": the diagnosis, without a traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if summary["status"] == "failed":  # e.g. too many skipped updates, a non-finite final evaluation
        print(f"error: {summary['error']}", file=sys.stderr, flush=True)
    if summary["status"] != "ok":
        raise SystemExit(3 if summary["status"] == "preempted" else 1)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    cli.run(main)

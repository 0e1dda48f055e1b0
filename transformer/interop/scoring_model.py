"""A model to score or sample from, from a training run directory or a local Hugging Face model directory
(experiments.evaluate, the lm-evaluation-harness adapter: interop/lm_eval_model.py).

A run directory (config.json with model and train sections, checkpoints/) gives its parameters at a checkpoint
(training/restore.load_run), its recorded tokenizer and its data.seq_len; a Hugging Face directory (config.json
with a `model_type`: GPT-2, LLaMA, Qwen3, GPT-NeoX decoders, T5 encoder–decoders) is imported (hf.from_pretrained),
its tokenizer.json read as the data.tokenizer of that name would be, and its length is the model's positions (capped
at MAX_HF_LENGTH for positions without a table). Decoders and encoder–decoders score (their rows: `layout`,
data/scoring_rows.py; an encoder–decoder's encoder and decoder rows both of that length); an encoder (BERT) is one
ConfigError.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from transformer.data.scoring_rows import Layout
from transformer.data.tokenizers import Tokenizer, load_tokenizer_file
from transformer.spec import ConfigError, MissingInputError

MAX_HF_LENGTH = 2048  # a Hugging Face model's default length where its positions are not a table (RoPE)


@dataclasses.dataclass(frozen=True)
class ScoringModel:
    """model (a DecoderLM or EncoderDecoderModel), params (on one device), its tokenizer, what it is (`source`:
    "run" or "huggingface"; `step`: the run's checkpoint step, None for Hugging Face), `task` (whose forward the
    scoring step calls: LMTask, or SpanCorruptionTask for an encoder–decoder) and `layout` (its scoring rows,
    data/scoring_rows.Layout)."""
    model: Any
    params: Any
    tokenizer: Tokenizer
    source: str
    step: int | None
    path: str
    task: Any
    layout: Layout

    @property
    def family(self) -> str:
        return self.model.cfg.family

    @property
    def seq_len(self) -> int:
        """The (decoder) rows' length."""
        return self.layout.target_len


def _is_run(path: str) -> bool:
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model" in config and "train" in config


def load(path: str, *, step: int | None = None, seq_len: int = 0, setting: str = "--workdir") -> ScoringModel:
    """The decoder or encoder–decoder in `path` (the module docstring); `seq_len` > 0 sets the rows' length (at most
    the model's positions where they are a table)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise MissingInputError(f"{setting}={path} does not exist")
    if _is_run(path):
        from transformer.training.restore import load_run

        run = load_run(path, step=step)
        model, params, tokenizer, length = run.model, run.params, run.tokenizer, int(run.spec.data.seq_len)
        source, at, decoder_start = "run", run.step, None
    else:
        from transformer.interop import hf

        if step is not None:
            raise ConfigError(f"--step={step}: {path} is a Hugging Face directory, which has no checkpoints")
        model, params = hf.from_pretrained(path)
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise MissingInputError(f"{path} has no tokenizer.json: the model's text cannot be tokenized")
        tokenizer = load_tokenizer_file(path, setting)
        length = min(int(model.cfg.max_len), MAX_HF_LENGTH)
        source, at = "huggingface", None
        with open(os.path.join(path, "config.json")) as f:
            decoder_start = int(json.load(f).get("decoder_start_token_id") or 0)  # its own (T5's: pad, 0)
    cfg = model.cfg
    if cfg.family not in ("decoder", "encoder_decoder"):
        raise ConfigError(f"{setting}={path}: a model.family={cfg.family!r} model; likelihood scoring needs a decoder "
                          "or an encoder–decoder")
    limit = int(cfg.max_len) if cfg.positional in ("learned", "sinusoidal") else None
    if seq_len:
        if limit is not None and seq_len > limit:
            raise ConfigError(f"--seq_len={seq_len} is longer than the model's {limit} positions")
        length = seq_len
    from transformer.training import scoring
    from transformer.tasks.lm import LMTask
    from transformer.tasks.seq2seq import SpanCorruptionTask

    task = LMTask() if cfg.family == "decoder" else SpanCorruptionTask()
    return ScoringModel(model, params, tokenizer, source, at, path, task,
                        scoring.layout_for(task.name, int(length), decoder_start))

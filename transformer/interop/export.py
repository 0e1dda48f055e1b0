"""A training run's checkpoint as a Hugging Face checkpoint with its tokenizer (`experiments.export`).

export_run(workdir, out, step=None) writes into OUT:
  config.json, model.safetensors   to_pretrained (hf.py): GPT-2, LLaMA, Qwen3, GPT-NeoX, BERT or T5, by the model
                                   shape; special ids (bos/eos/pad; T5: decoder_start = the run's decoder
                                   start, bos) are the run's tokenizer's;
  tokenizer.json, tokenizer_config.json   hf_tokenizer.py: the run's tokenizer, bos prepended by
                                   tokenizer(text), the task's extra ids (span corruption's sentinels
                                   <extra_id_i>, the masked LM's [MASK]) after the vocabulary;
and returns a summary (step, family, HF model type, paths). The run's model is padded to a vocabulary of a
multiple of 128: the exported model keeps those rows (the tokenizer never produces their ids).
Everything is checked before anything is written: a missing run or checkpoint, a model with no Hugging Face
counterpart (e.g. positional=alibi, sinusoidal positions) or with a parameter its family's layout has no place
for (hf.hf_tensors), an OUT that holds files already.
"""
from __future__ import annotations

import os
from typing import Any

from transformer.spec import ConfigError, MissingInputError
from transformer.data import get_tokenizer
from transformer.interop.hf import converter_for, to_pretrained
from transformer.interop.hf_tokenizer import to_hf_tokenizer
from transformer.training.resolve import model_config
from transformer.training.restore import latest_step, load_config, load_run, recorded_spec

HF_CLASSES = {"gpt2": "AutoModelForCausalLM", "llama": "AutoModelForCausalLM", "qwen3": "AutoModelForCausalLM",
              "gpt_neox": "AutoModelForCausalLM", "bert": "AutoModelForMaskedLM",
              "t5": "AutoModelForSeq2SeqLM"}


def _extra_tokens(spec: Any, tokenizer: Any) -> tuple[list[str], str | None]:
    """The task's ids past the tokenizer's vocabulary, as token names, and the mask token among them (`spec`: the
    run's RunSpec)."""
    task = spec.train.task or "lm"
    if task == "span_corruption":
        from transformer.data.span_corruption import span_corruption_lengths
        return [f"<extra_id_{i}>" for i in range(span_corruption_lengths(spec.data)[2])], None
    if task == "mlm":
        return ["[MASK]"], "[MASK]"
    return [], None


def export_run(workdir: str, out: str, step: int | None = None) -> dict[str, Any]:
    """Writes the run's checkpoint (latest or `step`) and tokenizer as a Hugging Face directory OUT (either path
    may be relative to the working directory)."""
    workdir, out = (os.path.abspath(os.path.expanduser(p)) for p in (workdir, out))
    config = load_config(workdir)
    step = latest_step(workdir) if step is None else step
    if not os.path.isdir(os.path.join(workdir, "checkpoints", str(step), "state")):
        raise MissingInputError(f"--step={step}: no checkpoint {os.path.join(workdir, 'checkpoints', str(step))}")
    if os.path.isdir(out) and os.listdir(out):
        raise ConfigError(f"--out={out} exists and is not empty; choose a new directory")
    spec = recorded_spec(config)
    tokenizer = get_tokenizer(spec.data, workdir=workdir)
    model_cfg = model_config(config, _model_vocab(spec, tokenizer))
    name, _ = converter_for(model_cfg)           # ConfigError: no Hugging Face counterpart
    extra, mask = _extra_tokens(spec, tokenizer)
    hf_tokenizer = to_hf_tokenizer(tokenizer, extra, mask)
    run = load_run(workdir, step=step)
    token_ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if model_cfg.family == "encoder_decoder":
        from transformer.data.span_corruption import DECODER_START_ID
        token_ids["decoder_start_token_id"] = DECODER_START_ID
    to_pretrained(run.model, run.params, out, token_ids=token_ids)
    hf_tokenizer.save_pretrained(out)
    return {"step": step, "family": model_cfg.family, "model_type": name, "hf_class": HF_CLASSES[name],
            "out": out, "files": sorted(os.listdir(out))}


def _model_vocab(config: Any, tokenizer: Any) -> int:
    from transformer.tasks import model_vocab_size
    return model_vocab_size(config, tokenizer)

"""A training run's checkpoint as a Hugging Face checkpoint with its tokenizer (`experiments.export`).

export_run(workdir, out, step=None) writes into OUT:
  config.json, model.safetensors   to_pretrained (hf.py): GPT-2, LLaMA, Qwen3, GPT-NeoX, BERT or T5, by the model
                                   shape; special ids (bos/eos/pad; T5: decoder_start = the run's decoder
                                   start, bos) are the run's tokenizer's;
  tokenizer.json, tokenizer_config.json   hf_tokenizer.py: the run's tokenizer, bos prepended by
                                   tokenizer(text), the task's extra ids (span corruption's sentinels
                                   <extra_id_i>, the masked LM's [MASK]) after the vocabulary;
and returns a summary (step, family, HF model type, paths). A LoRA run (model.lora) is written either merged
(`merge_lora`: each adapter folded into its kernel, layers/lora.merge: the plain model computing the adapted
model's function) or as its adapters alone in peft's format (`peft`: OUT/adapter_config.json +
adapter_model.safetensors, interop/peft.py; with the tokenizer files, over the base the run started from). The run's model is padded to a vocabulary of a
multiple of 128: the exported model keeps those rows (the tokenizer never produces their ids).
Everything is checked before anything is written: a missing run or checkpoint, a model with no Hugging Face
counterpart (e.g. positional=alibi, sinusoidal positions) or with a parameter its family's layout has no place
for (hf.hf_tensors), an OUT that holds files already.
"""
from __future__ import annotations

import os
from typing import Any

from transformer.layers import lora
from transformer.models import build_model
from transformer.spec import ConfigError, LoraSpec, MissingInputError
from transformer.data import get_tokenizer
from transformer.interop.hf import converter_for, to_pretrained
from transformer.interop.hf_tokenizer import to_hf_tokenizer
from transformer.training.resolve import model_config
from transformer.training.restore import latest_step, load_config, load_run, recorded_spec
from transformer.training.warm_start import is_hf_checkpoint

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


def _check_lora(workdir: str, model_cfg: Any, merge_lora: bool, peft: bool) -> None:
    """The LoRA flags fit the run: one of them for a LoRA run, neither for another."""
    if merge_lora and peft:
        raise ConfigError("--merge_lora and --peft exclude each other: the merged model, or the adapters alone")
    if (merge_lora or peft) and not model_cfg.lora.rank:
        raise ConfigError(f"--{'merge_lora' if merge_lora else 'peft'}: run {workdir} has no LoRA adapters "
                          f"(model.lora.rank=0); export it without the flag")
    if model_cfg.lora.rank and not (merge_lora or peft):
        raise ConfigError(f"run {workdir} trained LoRA adapters (model.lora.rank={model_cfg.lora.rank}) over a frozen "
                          f"model: --merge_lora writes the model with them merged, --peft the adapters alone in "
                          f"peft's format")


def export_run(workdir: str, out: str, step: int | None = None, *, merge_lora: bool = False,
               peft: bool = False) -> dict[str, Any]:
    """Writes the run's checkpoint (latest or `step`) and tokenizer as a Hugging Face directory OUT (either path
    may be relative to the working directory); a LoRA run merged (`merge_lora`) or as peft adapters (`peft`)."""
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
    _check_lora(workdir, model_cfg, merge_lora, peft)
    name, _ = converter_for(model_cfg.replace(lora=LoraSpec()))  # ConfigError: no Hugging Face counterpart
    if peft:
        from transformer.interop.peft import sites
        sites(name, model_cfg)                   # ConfigError: no peft mapping of this layout
    extra, mask = _extra_tokens(spec, tokenizer)
    hf_tokenizer = to_hf_tokenizer(tokenizer, extra, mask)
    run = load_run(workdir, step=step)
    token_ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if model_cfg.family == "encoder_decoder":
        from transformer.data.span_corruption import DECODER_START_ID
        token_ids["decoder_start_token_id"] = DECODER_START_ID
    if peft:
        from transformer.interop.peft import to_peft
        init_from = spec.train.init_from
        to_peft(model_cfg, run.params, out, base_model=init_from if init_from and is_hf_checkpoint(init_from) else None)
    elif merge_lora:
        merged_cfg, merged = lora.merge(model_cfg, run.params)
        to_pretrained(build_model(merged_cfg), merged, out, token_ids=token_ids)
    else:
        to_pretrained(run.model, run.params, out, token_ids=token_ids)
    hf_tokenizer.save_pretrained(out)
    return {"step": step, "family": model_cfg.family, "model_type": name, "hf_class": HF_CLASSES[name],
            "out": out, "files": sorted(os.listdir(out)), "lora": "peft" if peft else "merged" if merge_lora else None}


def _model_vocab(config: Any, tokenizer: Any) -> int:
    from transformer.tasks import model_vocab_size
    return model_vocab_size(config, tokenizer)

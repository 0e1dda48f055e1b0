"""Write a training run's checkpoint as a Hugging Face checkpoint with its tokenizer.

python -m experiments.export --workdir=DIR --out=HF_DIR [--step=STEP] [--merge_lora | --peft]

HF_DIR gets config.json + model.safetensors (GPT-2, LLaMA, Qwen3, GPT-NeoX, BERT or T5, from the run's model
shape) and tokenizer.json + tokenizer_config.json (the run's bytes / SentencePiece / tokenizer.json tokenizer;
tokenizer(text) prepends bos, as the run's documents began), so that
    AutoTokenizer.from_pretrained(HF_DIR), AutoModelForCausalLM.from_pretrained(HF_DIR)
(AutoModelForSeq2SeqLM for T5, AutoModelForMaskedLM for BERT) give the run's logits. A missing run or
checkpoint, a model with no Hugging Face counterpart (or a parameter its layout cannot hold), or a non-empty
HF_DIR is one `error:` line (exit 2). A LoRA run (model.lora) needs --merge_lora (the model with its adapters
merged) or --peft (the adapters alone in peft's format: adapter_config.json + adapter_model.safetensors).
"""
from __future__ import annotations

import json

from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from experiments.jax_setup import setup_jax

_WORKDIR = DEFINE_path("workdir", None, "Training run directory (config.json + checkpoints/).")
_OUT = DEFINE_path("out", None, "Directory to write the Hugging Face checkpoint into (new or empty).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_MERGE = flags.DEFINE_bool("merge_lora", False, "A LoRA run: write the model with its adapters merged into the kernels.")
_PEFT = flags.DEFINE_bool("peft", False, "A LoRA run: write its adapters alone in peft's format (adapter_config.json "
                          "+ adapter_model.safetensors), for peft.PeftModel.from_pretrained over the base model.")


def main(argv: list[str]) -> None:
    del argv
    setup_jax()
    from transformer.interop.export import export_run

    summary = export_run(_WORKDIR.value, _OUT.value, step=_STEP.value, merge_lora=_MERGE.value, peft=_PEFT.value)
    print(json.dumps(summary))
    if summary["lora"] == "peft":
        print(f"load it with peft.PeftModel.from_pretrained(base, {summary['out']!r}), base = "
              f"transformers.{summary['hf_class']}.from_pretrained(<the base model>)", flush=True)
        return
    print(f"load it with transformers.AutoTokenizer.from_pretrained({summary['out']!r}) and "
          f"transformers.{summary['hf_class']}.from_pretrained({summary['out']!r})", flush=True)


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir", "out"])
    cli.run(main)

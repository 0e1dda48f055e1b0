"""Print continuations of a prompt from a training run's latest checkpoint.

python -m experiments.sample --workdir=DIR --prompt=TEXT [--max_new_tokens=N --temperature=T --top_k=K
    --top_p=P --seed=S --num_samples=K --step=STEP]

Decoder runs: the prompt is encoded with the run's tokenizer after a bos token (training documents start
with one) and continued. Encoder–decoder runs (trained on span corruption): the prompt is the source, each
`<X>` in it becomes a sentinel, and the model writes what each sentinel stands for, printed after `<X0>`,
`<X1>`, ... Generation stops at the eos token; temperature=0 is greedy. Only the parameters are restored.
"""
from __future__ import annotations

import time

from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from experiments.jax_setup import setup_jax
from transformer.spec import ConfigError

_WORKDIR = DEFINE_path("workdir", None, "Training run directory (config.json + checkpoints/).")
_PROMPT = flags.DEFINE_string("prompt", "", "Text to continue (may be empty: the model starts a document).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate per sample.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep only the K most likely tokens (0: off).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: keep the most likely tokens up to mass P (1: off).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Continuations to print (sampled as one batch).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")


def _with_sentinels(tok, ids: list[int]) -> str:
    """Decoded text with each sentinel id (vocab_size + i) shown as <Xi>."""
    text, run = [], []
    for i in ids:
        if i >= tok.vocab_size:
            text.append(tok.decode(run) + f"<X{i - tok.vocab_size}>")
            run = []
        else:
            run.append(i)
    return "".join(text) + tok.decode(run)


def main(argv: list[str]) -> None:
    del argv
    setup_jax()
    import jax

    from transformer.inference.generate import generate, generate_seq2seq
    from transformer.training.restore import load_run
    from transformer.inference.sampling import SamplingConfig

    if _NUM_SAMPLES.value <= 0:
        raise ConfigError(f"--num_samples={_NUM_SAMPLES.value} must be a positive integer")
    sampling = SamplingConfig(temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value)
    run = load_run(_WORKDIR.value, step=_STEP.value)
    tok = run.tokenizer
    rng = jax.random.PRNGKey(_SEED.value)
    t0 = time.time()
    if run.model_cfg.family == "decoder":
        prompt = [tok.bos_id] + tok.encode(_PROMPT.value).tolist()
        out = generate(run.model, run.params, [prompt] * _NUM_SAMPLES.value, max_new_tokens=_MAX_NEW.value,
                       rng=rng, sampling=sampling, stop_tokens=[tok.eos_id], pad_id=tok.pad_id)
        texts = [_PROMPT.value + tok.decode(new) for new in out.sequences()]
    elif run.model_cfg.family == "encoder_decoder":
        parts = _PROMPT.value.split("<X>")
        source = []
        for i, part in enumerate(parts):
            source += tok.encode(part).tolist() + ([tok.vocab_size + i] if i < len(parts) - 1 else [])
        out = generate_seq2seq(run.model, run.params, [source + [tok.eos_id]] * _NUM_SAMPLES.value,
                               max_new_tokens=_MAX_NEW.value, decoder_start_id=tok.bos_id, rng=rng,
                               sampling=sampling, stop_tokens=[tok.eos_id], pad_id=tok.pad_id)
        texts = [_with_sentinels(tok, new) for new in out.sequences()]
    else:
        raise ConfigError(f"experiments.sample needs a decoder or encoder_decoder run; this run's model.family "
                          f"is {run.model_cfg.family!r}")
    seconds = time.time() - t0
    for i, (new, text) in enumerate(zip(out.sequences(), texts)):
        stopped = bool(new) and new[-1] == tok.eos_id
        print(f"--- sample {i + 1}/{_NUM_SAMPLES.value} (step {run.step}, {len(new)} tokens"
              f"{', ended at eos' if stopped else ''}) ---")
        print(text, flush=True)
    print(f"--- {int(out.lengths_B.sum())} tokens in {seconds:.1f}s (including compilation) ---")


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)

"""Print continuations of a prompt from a training run's latest checkpoint.

python -m experiments.sample --workdir=DIR --prompt=TEXT [--max_new_tokens=N --temperature=T --top_k=K
    --top_p=P --seed=S --num_samples=K --step=STEP]

The prompt is encoded with the run's tokenizer after a bos token (training documents start with
one); generation stops at the eos token. temperature=0 is greedy. Only the parameters are restored.
"""
from __future__ import annotations

import time

from absl import flags

from experiments import common
from transformer.models.config import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "Training run directory (config.json + checkpoints/).")
_PROMPT = flags.DEFINE_string("prompt", "", "Text to continue (may be empty: the model starts a document).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate per sample.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep only the K most likely tokens (0: off).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: keep the most likely tokens up to mass P (1: off).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Continuations to print (sampled as one batch).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")


def main(argv: list[str]) -> None:
    del argv
    common.setup_jax()
    import jax

    from transformer.inference.generate import generate
    from transformer.inference.restore import load_run
    from transformer.inference.sampling import SamplingConfig

    if _NUM_SAMPLES.value <= 0:
        raise ConfigError(f"--num_samples={_NUM_SAMPLES.value} must be a positive integer")
    sampling = SamplingConfig(temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value)
    run = load_run(_WORKDIR.value, step=_STEP.value)
    if run.model_cfg.family != "decoder":
        raise ConfigError(f"experiments.sample continues text with a decoder-only model; this run's "
                         f"model.family is {run.model_cfg.family!r}")
    tok = run.tokenizer
    prompt = [tok.bos_id] + tok.encode(_PROMPT.value).tolist()
    t0 = time.time()
    out = generate(run.model, run.params, [prompt] * _NUM_SAMPLES.value, max_new_tokens=_MAX_NEW.value,
                   rng=jax.random.PRNGKey(_SEED.value), sampling=sampling, stop_tokens=[tok.eos_id],
                   pad_id=tok.pad_id)
    seconds = time.time() - t0
    for i, new in enumerate(out.sequences()):
        stopped = bool(new) and new[-1] == tok.eos_id
        print(f"--- sample {i + 1}/{_NUM_SAMPLES.value} (step {run.step}, {len(new)} tokens"
              f"{', ended at eos' if stopped else ''}) ---")
        print(_PROMPT.value + tok.decode(new), flush=True)
    print(f"--- {int(out.lengths_B.sum())} tokens in {seconds:.1f}s (including compilation) ---")


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir"])
    common.run(main)

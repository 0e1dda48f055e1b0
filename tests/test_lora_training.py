"""LoRA runs end to end: fine-tuning from train.init_from trains the adapters only (the base stays the source's
bit for bit), checkpoints and resumes exactly like any run, and a base the source cannot fill is refused."""
import json

import jax
import numpy as np
import pytest

from configs import lm
from transformer.spec import ConfigError
from transformer.training.loop import train
from transformer.training.restore import load_run


def _config(corpus_dir: str, steps: int):
    c = lm.get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(dict(steps=steps, batch_size=8, learning_rate=3e-3, warmup_steps=1, log_every=2, eval_every=4,
                        eval_steps=2, checkpoint_every=2))
    return c


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, corpus_dir):
    workdir = str(tmp_path_factory.mktemp("lora") / "base")
    assert train(_config(corpus_dir, 4), workdir, verbose=False)["status"] == "ok"
    return workdir


def _lora_config(corpus_dir: str, base: str, steps: int = 8):
    c = _config(corpus_dir, steps)
    c.model.lora.update(dict(rank=4, alpha=8.0, dropout=0.1, targets="query,value,mlp_out"))
    c.train.init_from = base
    return c


def _leaves(params) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}


@pytest.mark.slow
def test_lora_run_trains_adapters_only_and_resumes_exactly(tmp_path, corpus_dir, base_run):
    c = _lora_config(corpus_dir, base_run)
    full = train(c, str(tmp_path / "full"), verbose=False)
    assert full["status"] == "ok" and 0 < full["params_trainable"] < full["params"] / 10
    part = train(c, str(tmp_path / "resumed"), verbose=False, stop_at=5)
    assert part["status"] == "preempted"
    resumed = train(c, str(tmp_path / "resumed"), verbose=False)
    assert resumed["eval_loss"] == full["eval_loss"] and resumed["train_loss"] == full["train_loss"]
    rows = lambda d: [{k: v for k, v in json.loads(x).items() if k != "tokens_per_second"}
                      for x in open(tmp_path / d / "metrics.jsonl")]
    assert rows("resumed") == rows("full")
    base, tuned, again = (_leaves(load_run(d).params) for d in (base_run, str(tmp_path / "full"),
                                                                  str(tmp_path / "resumed")))
    for k in tuned:
        np.testing.assert_array_equal(tuned[k], again[k])  # the resumed run ends bit for bit as the full one
        if "lora" in k:
            continue
        np.testing.assert_array_equal(tuned[k], base[k])   # the frozen base: the source's, bit for bit
    adapters = [k for k in tuned if k.endswith("['lora_b']")]
    assert len(adapters) == 3 * 2 and all(np.abs(tuned[k]).max() > 0 for k in adapters)  # trained off zero
    assert full["eval_loss"] < json.load(open(f"{base_run}/summary.json"))["eval_loss"] + 0.5


@pytest.mark.slow
def test_frozen_parameters_the_source_lacks_are_refused(tmp_path, corpus_dir, base_run):
    c = _lora_config(corpus_dir, base_run)
    c.model.tie_embeddings = False  # an output head the tied source does not have: it would stay random
    with pytest.raises(ConfigError, match=r"model.lora.rank=4 freezes .*\['head'\]\['kernel'\]"):
        train(c, str(tmp_path / "untied"), verbose=False)
    assert not (tmp_path / "untied").exists()


@pytest.mark.slow
def test_export_merged_and_as_peft_adapters(tmp_path, corpus_dir, base_run):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from transformer.interop.export import export_run

    c = _lora_config(corpus_dir, base_run, steps=2)
    c.train.learning_rate = 3e-2  # adapters far enough from zero to change the logits
    workdir = str(tmp_path / "lora")
    train(c, workdir, verbose=False)
    run = load_run(workdir)
    tokens = np.asarray([[1, 40, 50, 60, 70, 80, 90]], np.int32)
    ours = np.asarray(run.model.apply({"params": run.params}, tokens))
    base = load_run(base_run)
    assert np.abs(ours - np.asarray(base.model.apply({"params": base.params}, tokens))).max() > 1e-3

    with pytest.raises(ConfigError, match="--merge_lora writes the model with them merged, --peft"):
        export_run(workdir, str(tmp_path / "plain"))
    with pytest.raises(ConfigError, match="has no LoRA adapters"):
        export_run(base_run, str(tmp_path / "no-lora"), merge_lora=True)
    assert not (tmp_path / "plain").exists() and not (tmp_path / "no-lora").exists()

    export_run(workdir, str(tmp_path / "merged"), merge_lora=True)
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.tensor(tokens)).logits.numpy(), ours, atol=1e-4, rtol=0)

    export_run(base_run, str(tmp_path / "base-hf"))
    summary = export_run(workdir, str(tmp_path / "adapters"), peft=True)
    assert summary["lora"] == "peft"
    tuned = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base-hf")), str(tmp_path / "adapters"))
    with torch.no_grad():
        np.testing.assert_allclose(tuned.eval()(input_ids=torch.tensor(tokens)).logits.numpy(), ours, atol=1e-4,
                                   rtol=0)


@pytest.mark.slow
def test_lora_from_a_hugging_face_directory(tmp_path, corpus_dir, base_run):
    pytest.importorskip("transformers")
    from transformer.interop import hf_warm_start  # noqa: F401  (registers the reader, as experiments.train does)
    from transformer.interop.export import export_run

    export_run(base_run, str(tmp_path / "base-hf"))
    c = _lora_config(corpus_dir, str(tmp_path / "base-hf"), steps=2)
    assert train(c, str(tmp_path / "from-hf"), verbose=False)["status"] == "ok"
    base, tuned = (_leaves(load_run(d).params) for d in (base_run, str(tmp_path / "from-hf")))
    for k in tuned:
        if "lora" not in k:
            np.testing.assert_array_equal(tuned[k], base[k])  # the frozen base: the exported run's

"""train.init_from=HF_DIR: fine-tuning from a local Hugging Face checkpoint (made here; nothing downloads).

The export → init_from round trip is judged by the loss: the continued run's first evaluation equals the
exported run's last one on the same batches. A LLaMA checkpoint written by `transformers` (an untied head, a
vocabulary of 300 padded to 384 here) is judged by `transformers`' own logits.
"""
from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from configs import lm  # noqa: E402
from transformer.interop import hf_warm_start  # noqa: E402,F401  registers the reader
from transformer.interop.export import export_run  # noqa: E402
from transformer.interop.hf import config_from_pretrained  # noqa: E402
from transformer.models import build_model  # noqa: E402
from transformer.spec import ConfigError  # noqa: E402
from transformer.training import sharding, warm_start  # noqa: E402
from transformer.training.optimizer import make_optimizer  # noqa: E402
from transformer.training.state import init_state  # noqa: E402


@pytest.mark.slow  # CI's 15 minutes: 21 s of the default run on 2 loaded cores (2026-11-27)
def test_export_then_init_from_continues_at_the_exported_loss(tiny_lm_run, tmp_path, monkeypatch):
    from transformer.training.loop import train

    out = str(tmp_path / "hf")
    export_run(tiny_lm_run, out)
    with open(f"{tiny_lm_run}/summary.json") as f:
        exported_loss = json.load(f)["eval_loss"]  # at step 4, the exported checkpoint

    c = lm.get_config("gpt2_tiny")  # the fixture's run, continued for one step that moves nothing
    with open(f"{tiny_lm_run}/config.json") as f:
        c.data.data_dir = json.load(f)["data"]["data_dir"]
    c.data.seq_len = 32
    c.train.update(steps=1, warmup_steps=1, batch_size=8, eval_every=1, eval_steps=1, checkpoint_every=1,
                   log_every=1, learning_rate=1e-12, init_from=out)
    summary = train(c, str(tmp_path / "continued"), verbose=False)
    assert summary["status"] == "ok"
    assert summary["eval_loss"] == pytest.approx(exported_loss, rel=1e-5)

    monkeypatch.setattr(warm_start, "READERS", {})  # a library user who did not import the reader
    with pytest.raises(ConfigError, match="is a Hugging Face checkpoint; reading it needs"):
        train(c, str(tmp_path / "unregistered"), verbose=False)


def _llama_dir(path: str) -> str:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def _state(cfg):
    """A fresh state of a model of `cfg` (the run's initialisation, before the warm start)."""
    c = lm.get_config("llama_tiny")
    c.data.seq_len, c.mesh.data = 16, 1
    model = build_model(cfg)
    mesh, rules = sharding.make_mesh(c.mesh, jax.devices()[:1]), sharding.rules(c.mesh)
    state, _ = init_state(model, make_optimizer(c.train), 0, (np.zeros((1, 16), np.int32),), mesh, rules)
    return model, state


@pytest.mark.slow  # CI's 15 minutes: 33 s of the default run on 2 loaded cores (2026-11-27)
def test_a_transformers_llama_checkpoint_initialises_a_padded_vocabulary_model(tmp_path):
    path = _llama_dir(str(tmp_path / "llama"))
    cfg = dataclasses.replace(config_from_pretrained(path), vocab_size=384)  # padded as a run pads it
    model, state = _state(cfg)
    state, report = warm_start.warm_start(state, path)
    assert len(report["copied"]) == len(jax.tree.leaves(state.params))
    assert sum("past the checkpoint's vocabulary" in k for k in report["kept"]) == 2  # table rows, head columns

    tokens = np.random.default_rng(0).integers(0, 300, (2, 16))
    with torch.no_grad():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()(
            torch.tensor(tokens)).logits.numpy()
    ours = np.asarray(model.apply({"params": state.params}, tokens))
    np.testing.assert_allclose(ours[..., :300], theirs, atol=1e-4, rtol=0)

    wrong = dataclasses.replace(cfg, d_ff=256)  # settings that do not describe the checkpoint's model
    with pytest.raises(ConfigError, match=r"model settings do not describe.*mlp.*model \(64, 256\), checkpoint "
                                          r"\(64, 128\)"):
        warm_start.warm_start(_state(wrong)[1], path)

"""Fine-tuning: a classifier initialised from a masked-LM run's checkpoint (train.init_from)."""
import jax
import numpy as np
import pytest

from configs import mlm
from transformer.training.restore import load_run
from transformer.spec import ConfigError
from transformer.training.loop import train


def _config(corpus_dir: str, preset: str, steps: int):
    c = mlm.get_config(preset)
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(dict(steps=steps, batch_size=8, warmup_steps=1, log_every=steps, eval_every=steps,
                        eval_steps=2, checkpoint_every=steps))
    return c


@pytest.mark.slow
def test_classifier_starts_from_the_mlm_encoder(tmp_path, corpus_dir):
    train(_config(corpus_dir, "modern_tiny", 3), str(tmp_path / "mlm"), verbose=False)
    c = _config(corpus_dir, "modern_tiny,classify", 1)
    c.train.learning_rate = 1e-12  # one step that moves nothing: the result shows the starting point
    c.train.init_from = str(tmp_path / "mlm")
    assert train(c, str(tmp_path / "cls"), verbose=False)["status"] == "ok"
    pre, fine = load_run(str(tmp_path / "mlm")).params, load_run(str(tmp_path / "cls")).params
    np.testing.assert_allclose(fine["token_embedding"]["embedding"], pre["token_embedding"]["embedding"],
                               atol=1e-6)
    for a, b in zip(jax.tree.leaves(fine["encoder"]), jax.tree.leaves(pre["encoder"])):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert "classifier" in fine and "mlm_head" not in fine  # the new head is freshly initialised

    c.train.init_from = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="train.init_from"):
        train(c, str(tmp_path / "cls2"), verbose=False)

"""Attention inspection: weights of every layer and head, their masks, labels, and the heatmap command."""
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.data import ByteTokenizer
from transformer.inference.attention_maps import attention_maps, layer_index, plot_attention, token_labels
from transformer.spec import ModelConfig
from transformer.models.decoder import DecoderLM
from transformer.models.encoder import EncoderModel
from transformer.models.encoder_decoder import EncoderDecoderModel
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(vocab_size=97, d_model=32, num_layers=3, num_heads=4, d_ff=64, max_len=32)


def _init(model, *inputs):
    return nn.unbox(model.init(jax.random.PRNGKey(0), *inputs)["params"])


def test_decoder_maps_are_causal_distributions_per_layer_and_head():
    model = DecoderLM(ModelConfig(**SMALL))
    tokens_BT = jax.random.randint(jax.random.PRNGKey(1), (2, 10), 3, 97)
    params = _init(model, tokens_BT)
    maps = attention_maps(model, params, tokens_BT)
    assert list(maps) == [f"blocks/layers_{i}/attention" for i in range(3)]
    for name, w in maps.items():
        assert w.shape == (2, 4, 10, 10) and layer_index(name) == list(maps).index(name)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(w, k=1) == 0)               # no query sees a later key
        assert np.all(np.diagonal(w, axis1=-2, axis2=-1) > 0)
    # the maps are those of the same forward pass: different heads attend differently
    assert np.abs(maps["blocks/layers_0/attention"][:, 0] - maps["blocks/layers_0/attention"][:, 1]).max() > 1e-4


def test_segments_keep_documents_apart_and_scanned_layers_split():
    cfg = ModelConfig(**SMALL, positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2)
    tokens_BT = jax.random.randint(jax.random.PRNGKey(1), (1, 8), 3, 97)
    segments_BT = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 0]])
    positions_BT = jnp.asarray([[0, 1, 2, 0, 1, 2, 3, 0]])
    model = DecoderLM(cfg)
    params = _init(model, tokens_BT)
    maps = attention_maps(model, params, tokens_BT, positions_BT, segments_BT)
    w = maps["blocks/layers_2/attention"][0]
    assert np.all(w[:, 3:7, :3] == 0) and np.all(w[:, :3, 3:] == 0)   # document 2 never sees document 1
    scanned = DecoderLM(cfg.replace(scan_layers=True))
    stacked = dict(params, blocks={"layers": jax.tree.map(lambda *a: jnp.stack(a), *params["blocks"].values())})
    scanned_maps = attention_maps(scanned, stacked, tokens_BT, positions_BT, segments_BT)
    assert list(scanned_maps) == list(maps)
    for name in maps:
        np.testing.assert_allclose(scanned_maps[name], maps[name], atol=1e-6)


@pytest.mark.slow  # CI's 15 minutes: 15 s of the default run on 2 loaded cores (2026-11-27)
def test_encoder_and_encoder_decoder_maps():
    tokens_BT = jax.random.randint(jax.random.PRNGKey(1), (1, 6), 3, 97)
    encoder = EncoderModel(ModelConfig(**SMALL, family="encoder", norm_position="post", embedding_norm=True))
    maps = attention_maps(encoder, _init(encoder, tokens_BT), tokens_BT)
    assert list(maps) == [f"encoder/blocks/layers_{i}/attention" for i in range(3)]
    assert np.triu(maps["encoder/blocks/layers_0/attention"], k=1).max() > 0   # bidirectional
    seq2seq = EncoderDecoderModel(ModelConfig(**SMALL, family="encoder_decoder", num_encoder_layers=2))
    tgt_BT = tokens_BT[:, :4]
    maps = attention_maps(seq2seq, _init(seq2seq, tokens_BT, tgt_BT), tokens_BT, tgt_BT)
    assert maps["decoder/blocks/layers_2/cross_attention"].shape == (1, 4, 4, 6)
    assert maps["decoder/blocks/layers_0/attention"].shape == (1, 4, 4, 4)
    assert len([k for k in maps if k.startswith("encoder/")]) == 2


def test_token_labels_show_bytes_as_characters():
    tok = ByteTokenizer()
    ids = [tok.bos_id] + tok.encode("a é\n\t€").tolist() + [0xC3 + 3, tok.eos_id]
    assert token_labels(tok, ids) == ["<bos>", "a", "␣", "é", "+é", "↵", "⇥", "€", "+€", "+€", "\\xc3", "<eos>"]


def test_plot_writes_a_png_and_checks_heads(tmp_path):
    w = np.full((4, 3, 3), 1 / 3, np.float32)
    path = plot_attention(w, ["a", "b", "c"], ["a", "b", "c"], "t", str(tmp_path / "x.png"), heads=[0, 3])
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="heads 0..3"):
        plot_attention(w, ["a"] * 3, ["a"] * 3, "t", str(tmp_path / "y.png"), heads=[4])


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLA_FLAGS=xla_flags(1))
    return subprocess.run([sys.executable, "-m", "experiments.attention", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_attention_cli_writes_heatmaps(tiny_lm_run, tmp_path):
    out = tmp_path / "maps"
    proc = _cli(f"--workdir={tiny_lm_run}", "--text=def f(x): é", f"--out={out}", "--layers=1", "--heads=0,2")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["attention.npz", "blocks_layers_1_attention.png"]
    saved = np.load(out / "attention.npz")
    assert saved["tokens"].shape == (13,) and saved["blocks_layers_0_attention"].shape == (4, 13, 13)
    proc = _cli(f"--workdir={tiny_lm_run}", "--text=x", f"--out={out}", "--heads=9")
    assert proc.returncode == 2 and "--heads" in proc.stderr and "Traceback" not in proc.stderr

"""Pruned heads against `transformers`: a BERT and a GPT-2 pruned here compute what the Hugging Face model pruned
by `prune_heads`' own procedure computes (transformers 5 dropped `model.prune_heads`; its
`pytorch_utils.prune_linear_layer` remains, and the test re-states the 4.x methods around it: BertAttention and
GPT2Attention.prune_heads); exported, the pruned model loads in `transformers` with the same logits; a Hugging Face
checkpoint as train.init_from fills a pruned model with its kept heads' rows."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from transformers.pytorch_utils import Conv1D, prune_linear_layer  # noqa: E402

from hf_checks import hf_logits, perturbed  # noqa: E402
from transformer.interop import hf_warm_start  # noqa: E402,F401  (registers the Hugging Face reader)
from transformer.interop.hf import from_pretrained, to_pretrained  # noqa: E402
from transformer.layers import head_pruning  # noqa: E402
from transformer.models import build_model  # noqa: E402
from transformer.training import warm_start  # noqa: E402

V, D, N = 80, 32, 4
TOKENS = np.random.default_rng(0).integers(3, V, (2, 9))
PRUNE = {0: [1, 3], 1: [2]}  # layer -> heads, Hugging Face's prune_heads argument


def _index(heads: list[int], head_size: int) -> torch.LongTensor:
    """transformers 4.x find_pruneable_heads_and_indices: the flat rows of the heads that stay."""
    mask = torch.ones(N, head_size)
    mask[heads] = 0
    return torch.arange(N * head_size)[mask.view(-1).eq(1)].long()


def _prune_bert(hf: torch.nn.Module) -> None:
    """BertAttention.prune_heads (transformers 4.x) on every layer of PRUNE."""
    for layer, heads in PRUNE.items():
        attention = hf.bert.encoder.layer[layer].attention
        index = _index(heads, D // N)
        for name in ("query", "key", "value"):
            setattr(attention.self, name, prune_linear_layer(getattr(attention.self, name), index))
        attention.output.dense = prune_linear_layer(attention.output.dense, index, dim=1)
        attention.self.num_attention_heads = N - len(heads)
        attention.self.all_head_size = attention.self.attention_head_size * (N - len(heads))


def _prune_conv1d(layer: Conv1D, index: torch.LongTensor, dim: int) -> Conv1D:
    """transformers 4.x prune_conv1d_layer: keep `index` along `dim` of the (in, out) weight."""
    weight = layer.weight.index_select(dim, index).detach().clone()
    bias = layer.bias.detach().clone() if dim == 0 else layer.bias[index].detach().clone()
    new = Conv1D(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        new.weight.copy_(weight)
        new.bias.copy_(bias)
    return new


def _prune_gpt2(hf: torch.nn.Module) -> None:
    """GPT2Attention.prune_heads (transformers 4.x) on every layer of PRUNE."""
    for layer, heads in PRUNE.items():
        attn = hf.transformer.h[layer].attn
        index = _index(heads, D // N)
        split = attn.split_size
        attn.c_attn = _prune_conv1d(attn.c_attn, torch.cat([index, index + split, index + 2 * split]), dim=1)
        attn.c_proj = _prune_conv1d(attn.c_proj, index, dim=0)
        attn.split_size = (split // N) * (N - len(heads))
        attn.num_heads = N - len(heads)


SHAPES = {
    "bert": (transformers.BertForMaskedLM, transformers.BertConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=N, intermediate_size=48,
        max_position_embeddings=16), _prune_bert, "encoder/blocks/layers_{}/attention"),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=V, n_embd=D, n_layer=2, n_head=N, n_positions=16), _prune_gpt2, "blocks/layers_{}/attention"),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n == "bert" else []) for n in SHAPES])
def test_pruned_model_matches_transformers_pruned_and_exports(name, tmp_path):
    cls, config, prune, path = SHAPES[name]
    hf = perturbed(cls, config)
    hf.save_pretrained(str(tmp_path / "hf"))
    model, params = from_pretrained(str(tmp_path / "hf"))
    pruned_heads = {path.format(layer): heads for layer, heads in PRUNE.items()}
    cfg = model.cfg.replace(pruned_heads=pruned_heads)
    pruned = head_pruning.prune_params(model.cfg, params, cfg.pruned_heads)
    ours = np.asarray(build_model(cfg).apply({"params": pruned}, jnp.asarray(TOKENS, jnp.int32)))
    unpruned = np.asarray(model.apply({"params": params}, jnp.asarray(TOKENS, jnp.int32)))
    assert np.abs(ours - unpruned).max() > 1e-2  # the heads mattered

    prune(hf)
    assert sum(p.numel() for p in hf.parameters()) < sum(p.numel() for p in cls(config).parameters())
    np.testing.assert_allclose(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=0)

    # exported: transformers loads it (the removed heads as zero rows) and computes the pruned model
    to_pretrained(build_model(cfg), pruned, str(tmp_path / "export"))
    loaded = cls.from_pretrained(str(tmp_path / "export")).eval()
    np.testing.assert_allclose(hf_logits(loaded, TOKENS), ours, atol=1e-4, rtol=0)

    # train.init_from the unpruned Hugging Face checkpoint fills the pruned model with its kept heads
    abstract = jax.eval_shape(lambda r: build_model(cfg).init(r, jnp.zeros((1, 4), jnp.int32)), jax.random.PRNGKey(0))
    import flax.linen as nn
    source = warm_start.check_source(str(tmp_path / "hf"), nn.unbox(abstract["params"]), cfg.family, cfg)
    assert not source.kept
    want = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(pruned)}
    for key, tensor in source.tensors.items():
        np.testing.assert_array_equal(tensor, want[key], err_msg=key)

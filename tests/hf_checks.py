"""Checks shared by the Hugging Face interop tests: weights moved off their init, `transformers`' logits, and the
import → logits → export → `transformers` → re-import round trip. Import it after `pytest.importorskip("torch")`
and `pytest.importorskip("transformers")`."""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from transformer.interop.hf import from_pretrained, to_pretrained


def perturbed(cls: type, config: Any, scale: float = 0.05, seed: int = 0) -> torch.nn.Module:
    """`cls(config)` built under torch seed `seed`, in eval mode, with N(0, scale²) added to every weight (the norm
    scales too): the 0.02 init makes every logit ~0, and a comparison of ~0 with ~0 tells nothing."""
    torch.manual_seed(seed)
    hf = cls(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * scale)
    return hf


def hf_logits(hf: torch.nn.Module, tokens_BT: np.ndarray, **kwargs: np.ndarray) -> np.ndarray:
    """`transformers`' logits [B, T, V] for int tokens [B, T] (kwargs: attention_mask, position_ids, ...)."""
    with torch.no_grad():
        return hf(torch.tensor(tokens_BT), **{k: torch.tensor(v) for k, v in kwargs.items()}).logits.numpy()


def assert_round_trip(hf: torch.nn.Module, tmp_dir: str, tokens_BT: np.ndarray, tol: float):
    """Saves `hf` under tmp_dir/hf, imports it, checks our logits against `transformers`' (within `tol`, on logits
    not all ~0), exports, loads the export in `transformers` as the same class with the same logits, and re-imports
    it to the same config and bit-identical parameters. Returns (model, params, our logits [B, T, V])."""
    hf.save_pretrained(os.path.join(tmp_dir, "hf"))
    model, params = from_pretrained(os.path.join(tmp_dir, "hf"))
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(tokens_BT)))
    ref = hf_logits(hf, tokens_BT)
    assert np.abs(ref).max() > 0.5
    np.testing.assert_allclose(ours, ref, atol=tol, rtol=0)

    out = to_pretrained(model, params, os.path.join(tmp_dir, "export"))
    auto = transformers.AutoModelForMaskedLM if model.cfg.family == "encoder" else transformers.AutoModelForCausalLM
    hf2 = auto.from_pretrained(out).eval()
    assert type(hf2) is type(hf)
    np.testing.assert_allclose(hf_logits(hf2, tokens_BT), ours, atol=tol, rtol=0)
    model2, params2 = from_pretrained(out)
    assert model2.cfg == model.cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
    return model, params, ours

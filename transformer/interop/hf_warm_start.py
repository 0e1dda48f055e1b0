"""A local Hugging Face checkpoint directory as `train.init_from` (fine-tuning GPT-2, LLaMA, BERT or T5).

Importing this module registers `read_params` with training/warm_start.py (training sits below interop, so
it cannot import this itself); experiments.train and experiments.sweep import it. The conversion is hf.py's:
the checkpoint's config and tensors become this codebase's ModelConfig and parameter tree (numpy, float32);
warm_start matches them to the run's model by path and shape and puts each into its leaf's sharding.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import hf
from transformer.interop import tensors as t
from transformer.training import warm_start


def read_params(path: str) -> dict[str, Any]:
    """The checkpoint in PATH as this codebase's parameter tree of float32 numpy arrays (hf.from_pretrained's
    conversion, without building the model or placing anything on a device)."""
    _, converter = hf._converter(path)  # ConfigError: an unsupported model_type
    state = t.load_state_dict(path)
    cfg = hf.config_from_pretrained(path, state)
    params = converter.params_from_hf(state, cfg)
    return _to_float32(params)


def _to_float32(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_float32(v) for k, v in tree.items()}
    return np.asarray(tree, np.float32)


warm_start.register_reader("huggingface", read_params)

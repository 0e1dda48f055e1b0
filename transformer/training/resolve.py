"""A training config resolved and checked the way `train` does it, before any data is read or compiled."""
from __future__ import annotations

import dataclasses
from typing import Any

from transformer.data import get_tokenizer
from transformer.data.identity import IDENTITY_KEY, RunData, check_same, check_settings, resolvable, resolve_data
from transformer.models.config import ModelConfig
from transformer.tasks import model_vocab_size
from transformer.training import validate


@dataclasses.dataclass(frozen=True)
class Resolved:
    """model_cfg: the validated ModelConfig; mesh_shape: (data, fsdp, tensor); config: the dict written to
    DIR/config.json (the config with model.vocab_size filled in from the tokenizer where it was 0, and
    data.tokenizer_fingerprint and data.identity); data: the run's resolved data (identity.RunData: tokenizer,
    fingerprints, cache), None in a dry run whose tokenizer or documents are not built yet."""

    model_cfg: ModelConfig
    mesh_shape: tuple[int, ...]
    config: dict
    data: RunData | None = None


def resolve(config: Any, num_devices: int, process_count: int, tokenizer: Any = None) -> Resolved:
    """Validates `config` for this many devices and processes (ConfigError naming the setting on a mistake).
    `tokenizer`: anything with `vocab_size`; default: the one `data.tokenizer` names."""
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(config.data)
    model_cfg = validate.model_config(config, model_vocab_size(config, tokenizer))
    mesh_shape = validate.check_training(config, model_cfg, num_devices, process_count)
    resolved = config.to_dict()
    resolved["model"]["vocab_size"] = model_cfg.vocab_size
    if getattr(tokenizer, "fingerprint", None):  # which tokenizer the run used (its copy is in the workdir)
        resolved["data"]["tokenizer_fingerprint"] = tokenizer.fingerprint
    data = resolve_data(config.data, tokenizer) if resolvable(config.data, tokenizer) else None
    if data is None:
        check_settings(config.data)  # evaluation on training data is refused even in a dry run
    else:
        expected = config.data.get(IDENTITY_KEY)  # a sweep's recorded data (or an earlier run's config.json)
        check_same("data.identity (the data this run must train on, e.g. its sweep's)",
                   expected.to_dict() if hasattr(expected, "to_dict") else expected, data.identity())
        resolved["data"][IDENTITY_KEY] = data.identity()  # the documents and tokenizer, checked on resuming
    return Resolved(model_cfg, tuple(mesh_shape), resolved, data)

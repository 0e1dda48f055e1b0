"""LoRA's settings, `model.lora` (Hu et al. 2021), as a frozen, checked dataclass (standard library only).

`model.lora.rank` > 0 adds to each targeted projection W (a kernel of the frozen base model) a low-rank update
    y = x W + (alpha / rank) · dropout(x) A B,     A: (in, rank), B: (rank, out), B initialised to zero,
so a fresh adapter leaves the model's function unchanged (transformer/layers/lora.py). Targets are the layers'
logical projection names: the attention projections `query`, `key`, `value`, `out` (self- and cross-attention),
and the feed-forward layer's `mlp_in` (wi; a gated layer's wi_gate and wi_up) and `mlp_out` (wo). Only the
adapters train (and a classifying encoder's pooler and classifier, which no source holds: TRAINED_MODULES); the
rest of the model is frozen (training/optimizer.py masks it; the train step takes no gradient of it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from transformer.spec.errors import ConfigError

LORA_TARGETS = ("query", "key", "value", "out", "mlp_in", "mlp_out")
ATTENTION_TARGETS = ("query", "key", "value", "out")
# The parameter names of an adapter, beside its projection's kernel (and bias): .../query/lora_a, .../query/lora_b.
ADAPTER_NAMES = ("lora_a", "lora_b")
# Top-level modules that train in full under LoRA: a classifying encoder's head, which no source a run can start
# from holds (an MLM run has none; the Hugging Face BERT import reads no pooler), so frozen it would stay random.
TRAINED_MODULES = ("pooler", "classifier")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """rank: 0 (off) or the adapters' rank; alpha: the update's scale is alpha / rank (peft's lora_alpha);
    dropout: on the adapter's input only (peft's lora_dropout); targets: comma-separated LORA_TARGETS."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = "query,value"

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError(f"model.lora.rank={self.rank!r} must be a non-negative integer (0: no LoRA)")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha={self.alpha!r} must be a number > 0 (the update is scaled by "
                              f"alpha / rank)")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={self.dropout!r} must be in [0, 1)")
        if not isinstance(self.targets, str):
            raise ConfigError(f"model.lora.targets={self.targets!r} must be a comma-separated string of "
                              f"{', '.join(LORA_TARGETS)}")
        names = self.target_names
        unknown = [n for n in names if n not in LORA_TARGETS]
        if unknown or (self.rank and not names) or len(set(names)) != len(names):
            raise ConfigError(f"model.lora.targets={self.targets!r}: each of {', '.join(LORA_TARGETS)} at most once "
                              f"(comma-separated; at least one when model.lora.rank > 0)"
                              + (f"; unknown: {', '.join(unknown)}" if unknown else ""))

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.targets.split(",") if n.strip())

    @property
    def scaling(self) -> float:
        """alpha / rank: the factor on x A B."""
        return float(self.alpha) / self.rank if self.rank else 0.0

    def rank_of(self, target: str) -> int:
        """The adapter rank of projection `target` (a LORA_TARGETS name): rank where targeted, else 0."""
        return self.rank if self.rank and target in self.target_names else 0

    @classmethod
    def of(cls, value: Any) -> "LoraSpec":
        """From `config.model.lora` (a mapping or ConfigDict, keys as the fields) or a LoraSpec."""
        if isinstance(value, LoraSpec):
            return value
        if hasattr(value, "to_dict"):
            value = value.to_dict()
        if not isinstance(value, Mapping):
            raise ConfigError(f"model.lora={value!r} must be a mapping of rank, alpha, dropout, targets")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ConfigError(f"unknown model.lora setting(s) {', '.join('model.lora.' + k for k in unknown)}; "
                              f"valid: {', '.join(sorted(fields))}")
        return cls(**dict(value))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

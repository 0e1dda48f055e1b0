"""What a Hugging Face layout needs of a ModelConfig, and which settings its mapping reads.

Each converter (hf_gpt2.py, hf_llama.py, ...) states its layout as data, `NEEDS`: {setting: what it must be},
where "what" is a value, a tuple of allowed values, or a `Need` (a rule across settings, with its wording).
`unmet(cfg, NEEDS)` lists the settings a model gets wrong, each as `model.X=...`, so a refusal names the setting
to change instead of printing the whole config.

`unhandled(cfg, read)`: export writes a model only when every setting that is not its default was read by the
mapping (its NEEDS check and config_to_hf, recorded by `ReadRecorder`), only changes how the model is computed
(`IMPLEMENTATION`) or has no effect in this config (`INACTIVE`). A new model option that changes the function (say a residual scale) and that no mapping knows
is refused when it is on, instead of being exported as the plain architecture with other logits.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from transformer.spec import ModelConfig

# Settings that change how a model is computed or stored, not the function it computes: an exported checkpoint
# is float32, unscanned, and evaluated without dropout.
IMPLEMENTATION = ("attention_impl", "dtype", "param_dtype", "remat", "scan_layers", "dropout_rate")
# Settings that have no effect on a model of this config (the layers never read them there).
INACTIVE: dict[str, Callable[[ModelConfig], bool]] = {
    "rope_base": lambda c: c.positional != "rope",
    "max_len": lambda c: c.positional != "learned",  # only the learned table has a length
    "relative_num_buckets": lambda c: c.positional != "t5_relative",
    "relative_max_distance": lambda c: c.positional != "t5_relative",
    "mup_base_width": lambda c: c.parametrization == "sp",
    "mup_base_head_dim": lambda c: c.parametrization == "sp",
}


@dataclasses.dataclass(frozen=True)
class Need:
    """A rule `holds(cfg)` on a setting that depends on others; `wording` says what it must be."""

    holds: Callable[[Any], bool]
    wording: str


MULTI_HEAD = Need(lambda c: c.kv_heads == c.num_heads, "0 (multi-head attention: as many key/value heads as heads)")
FULL_WIDTH = Need(lambda c: c.dim_per_head * c.num_heads == c.d_model, "0 (heads of d_model // num_heads)")


def unmet(cfg: Any, needs: Mapping[str, Any]) -> list[str]:
    """The settings of `cfg` that `needs` rejects, as "model.X=<needed> (got <value>)", in `needs`' order."""
    out = []
    for name, need in needs.items():
        value = getattr(cfg, name)
        if isinstance(need, Need):
            ok, wanted = need.holds(cfg), need.wording
        elif isinstance(need, tuple):
            ok, wanted = value in need, " | ".join(map(repr, need))
        else:
            ok, wanted = value == need, repr(need)
        if not ok:
            out.append(f"model.{name}={wanted} (got {value!r})")
    return out


class ReadRecorder:
    """A ModelConfig stand-in that records which of its fields are read (`read`). Properties are evaluated on the
    recorder, so reading `kv_heads` records `num_kv_heads` (and `num_heads`)."""

    def __init__(self, cfg: ModelConfig):
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> Any:
        cfg = object.__getattribute__(self, "_cfg")
        attr = getattr(type(cfg), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if name in {f.name for f in dataclasses.fields(cfg)}:
            self.read.add(name)
        return getattr(cfg, name)


def unhandled(cfg: ModelConfig, read: set[str]) -> list[str]:
    """Settings of `cfg` away from their default that a mapping did not read, that do not only change the
    computation (IMPLEMENTATION) and that are not inactive in this config (INACTIVE)."""
    return [f"model.{f.name}={getattr(cfg, f.name)!r} (default {f.default!r})" for f in dataclasses.fields(cfg)
            if f.name not in read and f.name not in IMPLEMENTATION and getattr(cfg, f.name) != f.default
            and not (f.name in INACTIVE and INACTIVE[f.name](cfg))]

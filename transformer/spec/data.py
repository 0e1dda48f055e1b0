"""The data.* settings as one frozen, checked dataclass (standard library only).

`DataSpec` holds every setting the data package reads, under the config's own key names, so a data function
that reads `data_cfg.seq_len` or `data_cfg.get("eval_files", "")` works the same on a DataSpec as on the
config's data block. Its constructor runs the plain-value checks of the data settings (each one ConfigError
naming the setting); the checks that read files (the globs, eval files that are copies of training files) stay
with the data package (data/identity.check_settings). `DataSpec.of` turns a ConfigDict's data block, a dict or
a DataSpec into a DataSpec: the data package's entry points call it, so they run the same checks whichever
they are given.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Iterator, Mapping

from transformer.spec.errors import ConfigError

_OPTIONAL = ("classes", "noise_density", "mean_noise_span_length", "tokenizer_fingerprint", "identity")


def _plain(value: Any) -> Any:
    """A ConfigDict (or nested one) as plain dicts and lists."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The data.* settings (defaults: configs/common.py's). Optional settings (the classification task's
    `classes`, span corruption's `noise_density` / `mean_noise_span_length`, and what resolve records:
    `tokenizer_fingerprint`, `identity`) are None when the config does not set them; `extra`: any other key
    of the config's data block, kept as it was."""

    tfds_name: str = "stdlib_py"
    data_dir: str = ""
    text_feature: str = "text"
    train_split: str = "train"
    eval_split: str = "validation"
    files: str = ""
    eval_files: str = ""
    eval_fraction: float = 0.01
    cache_dir: str = ""
    tokenizer: str = "bytes"
    vocab_size: int = 1024
    seq_len: int = 256
    shuffle_seed: int = 0
    worker_count: int = 0
    classes: tuple[str, ...] | None = None
    noise_density: float | None = None
    mean_noise_span_length: float | None = None
    tokenizer_fingerprint: str | None = None
    identity: dict | None = dataclasses.field(default=None, compare=False)
    extra: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, numbers.Integral) or self.seq_len <= 0:
            raise ConfigError(f"data.seq_len={self.seq_len!r} must be a positive integer")
        if (isinstance(self.worker_count, bool) or not isinstance(self.worker_count, numbers.Integral)
                or self.worker_count < 0):
            raise ConfigError(f"data.worker_count={self.worker_count!r} must be >= 0")
        object.__setattr__(self, "seq_len", int(self.seq_len))
        object.__setattr__(self, "worker_count", int(self.worker_count))
        uses_files = bool(str(self.files or "").strip())
        if uses_files and not str(self.eval_files or "").strip():
            fraction = self.eval_fraction
            if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0.0 < fraction < 1.0:
                raise ConfigError(f"data.eval_fraction={fraction!r} must be in (0, 1) when data.eval_files is empty")
        if not uses_files and self.eval_split == self.train_split:
            raise ConfigError(f"data.eval_split={self.eval_split!r} is data.train_split: evaluation would be on the "
                              f"training data; choose another split of data.tfds_name={self.tfds_name!r} "
                              f"(e.g. 'validation' or 'test')")
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(self.classes))

    @classmethod
    def of(cls, data: Any) -> "DataSpec":
        """`data` (a DataSpec, a ConfigDict's data block or a dict) as a checked DataSpec."""
        if isinstance(data, DataSpec):
            return data
        d = _plain(data)
        fields = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in fields}
        if known.get("identity") is not None:
            known["identity"] = dict(known["identity"])
        return cls(**known, extra={k: v for k, v in d.items() if k not in fields})

    # The read interface of the config's data block (attribute access is the dataclass's own).
    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError(f"DataSpec has no setting {name!r} (data.{name} is not a data setting)")

    def get(self, key: str, default: Any = None) -> Any:
        """The setting `key`, or `default` when it is unset (an optional setting left None, or unknown)."""
        value = self.to_dict().get(key)
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        d = self.to_dict()
        if key not in d:
            raise KeyError(key)
        return d[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def keys(self) -> Iterator[str]:
        return iter(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The settings as the config's data block holds them (optional settings only when set, `extra`'s keys
        alongside): equal to the ConfigDict's to_dict() it was built from, bar tuples read back as lists."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d = {k: v for k, v in d.items() if not (k in _OPTIONAL and v is None)}
        if d.get("classes") is not None:
            d["classes"] = tuple(d["classes"])
        return {**d, **self.extra}

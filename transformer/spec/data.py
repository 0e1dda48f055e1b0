"""The data.* settings as one frozen, checked dataclass (standard library only).

`DataSpec` holds every setting the data package reads, under the config's own key names, so a data function
that reads `data_cfg.seq_len` or `data_cfg.get("eval_files", "")` works the same on a DataSpec as on the
config's data block. Its constructor runs the plain-value checks of the data settings (each one ConfigError
naming the setting); the checks that read files (the globs, eval files that are copies of training files) stay
with the data package (data/identity.check_settings). `DataSpec.of` turns a ConfigDict's data block, a dict or
a DataSpec into a DataSpec: the data package's entry points call it, so they run the same checks whichever
they are given. The predicates the data package branches on are DataSpec's properties, defined once here:
`uses_files` (local files replace the TFDS dataset), `has_eval_files`, `holds_out` (documents held out by
data.eval_fraction), and the globs of `data.files` / `data.eval_files` (`split_globs`: a comma-separated string,
`\\,` a literal comma, or a list of globs).
"""
from __future__ import annotations

import dataclasses
import numbers
import re
from typing import Any, Iterator, Mapping

from transformer.spec.errors import ConfigError

_STRINGS = ("tfds_name", "data_dir", "text_feature", "train_split", "eval_split", "cache_dir", "tokenizer")
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


def split_globs(value: Any, setting: str = "data.files") -> list[str]:
    """The globs of a data.files / data.eval_files value: a string of comma-separated globs (`\\,` stands for a
    comma inside a glob: `a\\,b.txt` names the file `a,b.txt`), or a list/tuple of globs taken whole (a comma in
    one is part of it). Blank globs are dropped; "" or [] names no file. ConfigError for anything else."""
    if value is None:
        return []
    if isinstance(value, str):
        parts = [p.replace("\\,", ",") for p in re.split(r"(?<!\\),", value)]
    elif isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise ConfigError(f"{setting}={value!r} must be a string of comma-separated globs or a list of globs")
    return [p.strip() for p in parts if p.strip()]


def join_globs(globs: list[str]) -> str:
    """The comma-separated string that split_globs reads back as `globs` (a comma in a glob escaped)."""
    return ",".join(g.replace(",", "\\,") for g in globs)


HELDOUT = "heldout"  # data.eval_sets: the run's own evaluation split (data.eval_split, eval_files or held out)
_SET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def eval_set_entries(value: Any) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    """The named evaluation sets of data.eval_sets: ((name, target), ...) in the order given, `target` HELDOUT (the
    run's own evaluation split) or a tuple of globs of local files (the formats of data.files). `value`: a mapping
    {name: globs or "heldout"} (globs as data.files takes them), or a string "name=globs;name=globs" ("" or {}:
    none). A name is letters, digits, `_`, `.`, `-` (it keys the metrics: eval/NAME/loss). ConfigError otherwise."""
    setting = "data.eval_sets"
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        pairs = []
        for part in (p.strip() for p in value.split(";")):
            if not part:
                continue
            name, eq, target = part.partition("=")
            if not eq:
                raise ConfigError(f"{setting}: {part!r} is not NAME=FILES; give e.g. "
                                  f"'wiki=~/wiki/*.jsonl;own={HELDOUT}' (';' between sets)")
            pairs.append((name.strip(), target.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ConfigError(f"{setting}={value!r} must be a mapping {{name: files}} or a string 'name=files;...'")
    out, seen = [], set()
    for name, target in pairs:
        if not isinstance(name, str) or not _SET_NAME.match(name):
            raise ConfigError(f"{setting}: the set name {name!r} must be letters, digits, '_', '.' or '-'")
        if name in seen:
            raise ConfigError(f"{setting}: the set name {name!r} is given twice")
        seen.add(name)
        if target == HELDOUT:
            out.append((name, HELDOUT))
            continue
        globs = tuple(split_globs(target, f"{setting}.{name}"))
        if not globs:
            raise ConfigError(f"{setting}.{name} names no file; give globs of local files (the formats of "
                              f"data.files) or {HELDOUT!r} (the run's own evaluation split)")
        out.append((name, globs))
    return tuple(out)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive integer" if minimum == 1 else f">= {minimum}, an integer"
        raise ConfigError(f"data.{name}={value!r} must be {what}")
    return int(value)


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
    files: str | tuple[str, ...] = ""        # globs: split_globs
    eval_files: str | tuple[str, ...] = ""
    eval_sets: Any = ""                      # named evaluation sets: eval_set_entries
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
        for name in _STRINGS:
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"data.{name}={getattr(self, name)!r} must be a string")
        if not self.text_feature.strip():
            raise ConfigError("data.text_feature is empty; name the field (jsonl), column (parquet) or feature (TFDS) "
                              "that holds the text, e.g. 'text'")
        object.__setattr__(self, "seq_len", _check_int("seq_len", self.seq_len, 1))
        object.__setattr__(self, "worker_count", _check_int("worker_count", self.worker_count, 0))
        object.__setattr__(self, "shuffle_seed", _check_int("shuffle_seed", self.shuffle_seed, 0))
        object.__setattr__(self, "vocab_size", _check_int("vocab_size", self.vocab_size, 1))
        eval_set_entries(self.eval_sets)  # the names and globs checked
        for name in ("files", "eval_files"):
            value = getattr(self, name)
            split_globs(value, f"data.{name}")  # the type checked
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        fraction = self.eval_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
            raise ConfigError(f"data.eval_fraction={fraction!r} must be a number in (0, 1)")
        if self.holds_out and not 0.0 < fraction < 1.0:
            raise ConfigError(f"data.eval_fraction={fraction!r} must be in (0, 1) when data.eval_files is empty")
        if not self.uses_files and self.eval_split == self.train_split:
            raise ConfigError(f"data.eval_split={self.eval_split!r} is data.train_split: evaluation would be on the "
                              f"training data; choose another split of data.tfds_name={self.tfds_name!r} "
                              f"(e.g. 'validation' or 'test')")
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(self.classes))

    @property
    def file_globs(self) -> list[str]:
        """The globs of data.files (split_globs)."""
        return split_globs(self.files, "data.files")

    @property
    def eval_file_globs(self) -> list[str]:
        """The globs of data.eval_files (split_globs)."""
        return split_globs(self.eval_files, "data.eval_files")

    @property
    def eval_set_list(self) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
        """data.eval_sets as ((name, HELDOUT or its globs), ...) in the order given (eval_set_entries)."""
        return eval_set_entries(self.eval_sets)

    @property
    def uses_files(self) -> bool:
        """Whether data.files names local files (they replace the TFDS dataset data.tfds_name)."""
        return bool(self.file_globs)

    @property
    def has_eval_files(self) -> bool:
        """Whether local files are evaluated on data.eval_files (not on documents held out of data.files)."""
        return self.uses_files and bool(self.eval_file_globs)

    @property
    def holds_out(self) -> bool:
        """Whether the eval documents are those of data.files held out by data.eval_fraction (a hash of each)."""
        return self.uses_files and not self.eval_file_globs

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

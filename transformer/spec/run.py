"""A whole run resolved and checked: model, train and mesh specs, and the config dict written to DIR/config.json.

`RunSpec` is built by the resolve step (training/resolve.py: ConfigDict + devices + tokenizer) or read back from
a run's config.json (`from_json`); its constructor runs the checks that join the parts (sequence length against
the model's positions, the batch and the model dimensions against the mesh). Standard library and numpy only.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from transformer.files import write_json
from transformer.spec.errors import ConfigError, MissingInputError, check_positive_int
from transformer.spec.accounting import padded_vocab_size
from transformer.spec.data import DataSpec
from transformer.spec.mesh import MeshSpec
from transformer.spec.model import FAMILIES, ModelConfig
from transformer.spec.schedule import TrainSpec

# The training tasks each model family supports (transformer/tasks implements them); the first is the family's
# default (train.task=""). A task of another family would train something else than it says (a bidirectional
# encoder on next-token targets it can see) or fail deep in the model: run_task refuses it.
FAMILY_TASKS: dict[str, tuple[str, ...]] = {"decoder": ("lm",), "encoder": ("mlm", "classify"),
                                            "encoder_decoder": ("span_corruption",)}
assert set(FAMILY_TASKS) == set(FAMILIES)


def section_defaults() -> dict[str, dict[str, Any]]:
    """{section: {key: default}} of the config sections a run records (model, train, data; JSON values): what a
    key absent from an older config.json or sweep.json means. A key added later "default OFF" (docs/extending.md)
    is absent from the runs recorded before it and means its default there, so they resume under the new code.
    (Changing an existing default would change what older records mean: give the new behaviour a new value.)"""
    from transformer.spec.model import model_defaults

    data = {f.name: f.default for f in dataclasses.fields(DataSpec)
            if f.default is not None and f.default is not dataclasses.MISSING}
    train = {f.name: f.default for f in dataclasses.fields(TrainSpec)}
    return json.loads(json.dumps({"model": model_defaults(), "train": train, "data": data}))


def run_task(family: str, task: str) -> str:
    """The task a run of `family` trains: train.task, or "" for the family's default (FAMILY_TASKS). A task
    the family does not support is one ConfigError naming model.family, train.task and the valid tasks."""
    valid = FAMILY_TASKS.get(family)
    if valid is None:
        raise ConfigError(f"model.family={family!r} is not valid; choose one of {', '.join(FAMILY_TASKS)}")
    if not task:
        return valid[0]
    if task not in valid:
        other = [f for f, tasks in FAMILY_TASKS.items() if task in tasks]
        raise ConfigError(f"train.task={task!r} does not fit model.family={family!r}"
                          + (f" (it is a task of model.family={other[0]!r})" if other else "")
                          + f"; valid for {family}: {', '.join(valid)} (\"\" = {valid[0]})")
    return task


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """model: the checked ModelConfig (vocab_size filled in); train: the train.* settings; mesh: the mesh for
    this many devices; seq_len: data.seq_len; config: the resolved config as written to DIR/config.json;
    data: the data.* settings (default: DataSpec.of(config["data"]), or the defaults with this seq_len)."""

    model: ModelConfig
    train: TrainSpec
    mesh: MeshSpec
    seq_len: int
    config: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    process_count: int = 1
    data: DataSpec | None = None

    def __post_init__(self) -> None:
        check_positive_int("data.seq_len", self.seq_len)
        if self.data is None:
            data = DataSpec.of(self.config["data"]) if "data" in self.config else DataSpec(seq_len=self.seq_len)
            object.__setattr__(self, "data", data)
        if self.data.seq_len != self.seq_len:
            raise ConfigError(f"data.seq_len={self.data.seq_len} of the data spec is not the run's {self.seq_len}")
        task, chunk = run_task(self.model.family, self.train.task), self.train.loss_chunk_size
        if chunk and task != "lm":
            raise ConfigError(f"train.loss_chunk_size={chunk} is for task lm only (this run's task is {task}); set "
                              f"it to 0")
        if chunk and self.seq_len % chunk:
            raise ConfigError(f"train.loss_chunk_size={chunk} must divide data.seq_len={self.seq_len}; valid: 0 "
                              f"(off), {', '.join(str(k) for k in range(1, self.seq_len + 1) if self.seq_len % k == 0)}")
        self.mesh.check_batch(self.train.batch_size, self.process_count)
        k, dp = self.train.grad_accum_steps, self.mesh.ways("batch")
        if k > 1 and (self.train.batch_size // k) % dp:
            raise ConfigError(f"train.grad_accum_steps={k}: a micro-batch of train.batch_size/{k}="
                              f"{self.train.batch_size // k} rows must split over the data-parallel size {dp} "
                              f"(mesh {self.mesh.describe()}); use a k with batch_size/k divisible by {dp}")
        m = self.model
        if m.lora.rank and not self.train.init_from:
            raise ConfigError(f"model.lora.rank={m.lora.rank} trains adapters over a frozen model: set "
                              f"train.init_from (a train workdir, or a local Hugging Face model directory) to the "
                              f"model to adapt, or model.lora.rank=0 to train every parameter")
        if m.positional != "none" and self.seq_len > m.max_len:
            what = ("the position table" if m.positional in ("learned", "sinusoidal") else
                    "the context length the model declares, e.g. max_position_embeddings on export")
            raise ConfigError(f"data.seq_len={self.seq_len} exceeds model.max_len={m.max_len} "
                              f"({what}, positional={m.positional!r}); raise model.max_len or lower seq_len")
        self.mesh.check_model(m)

    @classmethod
    def from_dict(cls, config: dict, num_devices: int = 1, process_count: int = 1) -> "RunSpec":
        """From a resolved config dict (config.json's content: model.vocab_size already filled in)."""
        model = ModelConfig.from_dict(config["model"], dtype=config["train"].get("compute_dtype", "float32"))
        return cls(model=model, train=TrainSpec.from_config(config["train"]),
                   mesh=MeshSpec.from_config(config["mesh"], num_devices), seq_len=config["data"]["seq_len"],
                   config=config, process_count=process_count, data=DataSpec.of(config["data"]))

    @classmethod
    def from_json(cls, path: str, num_devices: int = 1, process_count: int = 1) -> "RunSpec":
        """From a run's config.json (`path`: the file or its workdir). The model's attention_impl is the one the
        config named ("auto" stays "auto": the layers resolve it for the platform)."""
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise MissingInputError(f"{path} does not exist: not a run directory (no config.json)")
        with open(path) as f:
            return cls.from_dict(json.load(f), num_devices, process_count)

    def to_json(self, path: str) -> None:
        """Writes `config` (the resolved config) to `path` atomically, as the loop writes DIR/config.json."""
        write_json(path, self.config, indent=2, sort_keys=True)


def model_spec(config: Any, vocab_size: int) -> ModelConfig:
    """The checked ModelConfig of `config` (a ConfigDict or dict) for a tokenizer of `vocab_size` ids: when
    model.vocab_size is 0, that vocabulary padded to a multiple of 128 (an explicit size is used as is, and must
    hold the tokenizer's); the compute dtype from train.compute_dtype (its one setting). Registry names and
    attention_impl="auto" are left to the layers (training/resolve.model_config)."""
    model, train = config["model"], config["train"]
    d = dict(model.to_dict() if hasattr(model, "to_dict") else model)
    if not d.get("vocab_size"):
        d["vocab_size"] = padded_vocab_size(vocab_size)
    elif d["vocab_size"] < vocab_size:
        raise ConfigError(f"model.vocab_size={d['vocab_size']} is smaller than the tokenizer's vocabulary "
                          f"({vocab_size}); use 0 (take the tokenizer's) or at least {vocab_size}")
    return ModelConfig.from_dict(d, dtype=train["compute_dtype"] if "compute_dtype" in train else "float32")

"""The bottom layer: a run's settings as frozen, checked dataclasses and the arithmetic on them (standard
library and numpy only). errors (ConfigError), model (ModelConfig), data (DataSpec), accounting (parameters, FLOPs, padded
vocabulary), schedule (TrainSpec, lr_at), mesh (MeshSpec), run (RunSpec, config.json)."""
from transformer.spec.accounting import (VOCAB_MULTIPLE, attention_layers, flops_per_token, matmul_params,
                                         padded_vocab_size, padding_params, param_counts, train_flops)
from transformer.spec.data import DataSpec
from transformer.spec.errors import ConfigError, MissingInputError, check_choice, check_positive_int
from transformer.spec import pruning
from transformer.spec.lora import LORA_TARGETS, LoraSpec
from transformer.spec.mesh import MESH_AXES, MeshSpec, normalize_rules, resolve_shape
from transformer.spec.model import (AUTO, COMPUTE_DTYPES, FAMILIES, NORM_POSITIONS, PARAM_DTYPES, PARAMETRIZATIONS,
                                    REMAT_POLICIES, ModelConfig, model_defaults)
from transformer.spec.run import FAMILY_TASKS, RunSpec, model_spec, run_task, section_defaults
from transformer.spec.schedule import (ADDED_TRAIN_KEYS, AUTO_WARMUP, AUTO_WARMUP_FRACTION, AUTO_WARMUP_MAX, LR_ARITHMETIC,
                                       MAX_SKIPPED_FRACTION, NONFINITE_POLICIES, SCHEDULES, TrainSpec, decay_start,
                                       lr_at, train_spec, warmup_steps)

__all__ = [
    "ADDED_TRAIN_KEYS", "AUTO", "AUTO_WARMUP", "AUTO_WARMUP_FRACTION", "AUTO_WARMUP_MAX", "COMPUTE_DTYPES", "ConfigError", "DataSpec",
    "FAMILIES", "FAMILY_TASKS", "LORA_TARGETS", "LR_ARITHMETIC", "LoraSpec", "MAX_SKIPPED_FRACTION",
    "MESH_AXES", "MeshSpec", "MissingInputError", "ModelConfig", "NONFINITE_POLICIES", "NORM_POSITIONS",
    "PARAM_DTYPES", "PARAMETRIZATIONS", "REMAT_POLICIES", "RunSpec", "SCHEDULES", "TrainSpec", "VOCAB_MULTIPLE",
    "attention_layers", "check_choice", "check_positive_int", "decay_start", "flops_per_token", "lr_at",
    "matmul_params", "model_defaults", "model_spec", "normalize_rules", "padded_vocab_size", "padding_params", "param_counts", "resolve_shape",
    "run_task", "section_defaults", "train_flops", "train_spec", "warmup_steps",
]

"""The device mesh's shape ("data", "fsdp", "tensor") and its logical-axis rules as plain arithmetic (no JAX).

`MeshSpec.from_config(config.mesh, num_devices)` resolves a `-1` axis and checks the product; `ways(rule)`
is how many ways the mesh axes a rule names split a dimension, which the batch and the model's head, kv-head
and feed-forward dimensions must be divisible by (`check_batch`, `check_model`). training/sharding.py builds
the jax Mesh from `shape`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from transformer.spec.errors import ConfigError
from transformer.spec.model import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")


def normalize_rules(rules: Sequence[Sequence[Any]]) -> tuple[tuple[str, Any], ...]:
    """`mesh.rules` ((logical name, mesh axis | [axes] | None), ...) with lists made tuples (hashable)."""
    return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)


def resolve_shape(sizes: Any, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) from mesh sizes (a mapping with those keys; `-1`: all remaining devices), checked
    to multiply to `num_devices`."""
    sizes = [int(sizes[a]) for a in MESH_AXES]
    for axis, s in zip(MESH_AXES, sizes):
        if s == 0 or s < -1:
            raise ConfigError(f"mesh.{axis}={s} is not valid; use a positive size or -1 (all remaining devices)")
    if sizes.count(-1) > 1:
        raise ConfigError(f"mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(f"mesh {dict(zip(MESH_AXES, sizes))}: the fixed axes ({known}) do not divide "
                              f"the {num_devices} devices")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ConfigError(f"mesh {dict(zip(MESH_AXES, sizes))} has {math.prod(sizes)} devices but "
                          f"{num_devices} are available; make mesh.data*mesh.fsdp*mesh.tensor = {num_devices} "
                          f"or set one axis to -1")
    return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """shape: (data, fsdp, tensor) sizes, all positive; rules: mesh.rules, normalized."""

    shape: tuple[int, int, int]
    rules: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if len(self.shape) != len(MESH_AXES) or any(not isinstance(s, int) or s <= 0 for s in self.shape):
            raise ConfigError(f"mesh shape {self.shape!r} must be {len(MESH_AXES)} positive sizes {MESH_AXES}")
        for name, axes in self.rules:
            for axis in self._axes(axes):
                if axis not in MESH_AXES:
                    raise ConfigError(f"mesh.rules maps {name!r} to {axis!r}, which is not a mesh axis; "
                                      f"choose among {', '.join(MESH_AXES)} (or None)")

    @classmethod
    def from_config(cls, mesh: Any, num_devices: int) -> "MeshSpec":
        """From `config.mesh` (data, fsdp, tensor, rules) for this many devices."""
        rules = mesh["rules"] if "rules" in mesh else ()
        return cls(resolve_shape(mesh, num_devices), normalize_rules(rules))

    @staticmethod
    def _axes(axes: Any) -> tuple[str, ...]:
        return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> dict[str, int]:
        """{"data": d, "fsdp": f, "tensor": t}."""
        return dict(zip(MESH_AXES, self.shape))

    def rule_axes(self, rule: str) -> tuple[str, ...]:
        """The mesh axes mesh.rules maps the logical name `rule` to (() when unmapped)."""
        return self._axes(dict(self.rules).get(rule))

    def ways(self, rule: str) -> int:
        """How many ways the mesh splits a dimension named `rule` (1 when unmapped)."""
        return math.prod(self.shape[MESH_AXES.index(a)] for a in self.rule_axes(rule))

    def check_batch(self, batch_size: int, process_count: int) -> None:
        """train.batch_size must split over the data-parallel axes (the `batch` rule) and the processes."""
        dp = self.ways("batch")
        if batch_size % dp:
            raise ConfigError(f"train.batch_size={batch_size} must be divisible by the data-parallel size {dp} "
                              f"(mesh axes {self.rule_axes('batch')} of mesh {self.describe()})")
        if batch_size % process_count:
            raise ConfigError(f"train.batch_size={batch_size} must be divisible by the number of processes "
                              f"({process_count})")

    def check_model(self, model: ModelConfig) -> None:
        """Each model dimension must split evenly under its own parameter rule (heads, kv_heads, mlp)."""
        for name, size, rule in (("model.num_heads", model.num_heads, "heads"),
                                 ("model.num_kv_heads", model.kv_heads, "kv_heads"),
                                 ("model.d_ff", model.d_ff, "mlp")):
            ways = self.ways(rule)
            if size % ways:
                raise ConfigError(f"{name}={size} must be divisible by {ways}, the size of mesh axes "
                                  f"{self.rule_axes(rule)} that mesh.rules maps '{rule}' to (mesh {self.describe()})")

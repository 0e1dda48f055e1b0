"""The device mesh ("data", "fsdp", "tensor") and the logical-axis → mesh-axis mapping.

Model code names axes logically; `config.mesh.rules` maps them to mesh axes. Parameters and activations
have separate names (parameters: `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `vocab`, `norm`,
`classes`, `layers`; activations: `batch`, `seq`, `act_embed`, `act_heads`, `act_kv_heads`,
`act_head_dim`, `act_mlp`, `act_vocab`), so a rule means one thing and the order of the rules does not
decide any sharding (configs/common.py lists what each name does). Changing the parallelism is a
config change, never a model change.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from transformer.spec import MESH_AXES, ConfigError, MeshSpec, normalize_rules, resolve_shape


def mesh_shape(mesh_cfg: Any, num_devices: int) -> tuple[int, int, int]:
    """Resolves `-1` (all remaining devices) and checks the product equals the device count (spec.mesh)."""
    return resolve_shape(mesh_cfg, num_devices)


def make_mesh(mesh_cfg: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The jax Mesh of `mesh_cfg` (a run's MeshSpec, its shape resolved; or the config's mesh block)."""
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_cfg.shape if isinstance(mesh_cfg, MeshSpec) else mesh_shape(mesh_cfg, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def rules(mesh_cfg: Any) -> tuple[tuple[str, Any], ...]:
    """mesh.rules with lists made tuples (spec.mesh.normalize_rules)."""
    return normalize_rules(mesh_cfg.rules)


def logical_shardings(abstract_boxed: Any, mesh: Mesh, mesh_rules: Sequence[tuple[str, Any]]) -> Any:
    """NamedShardings for a pytree whose parameters carry logical names (nn.Partitioned boxes).

    Leaves without names (step counters, optimizer scalars) are replicated. The result has the
    structure of the *unboxed* tree.
    """
    specs = nn.get_partition_spec(abstract_boxed)
    return nn.logical_to_mesh_sharding(specs, mesh, mesh_rules)


def check_divisible(abstract: Any, shardings: Any) -> None:
    """Every sharded array dimension must split evenly over its mesh axes; names the first that doesn't."""
    for (path, leaf), s in zip(jax.tree_util.tree_leaves_with_path(abstract), jax.tree.leaves(shardings)):
        for dim, (size, axes) in enumerate(zip(leaf.shape, tuple(s.spec) + (None,) * leaf.ndim)):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            ways = int(np.prod([s.mesh.shape[a] for a in axes])) if axes else 1
            if size % ways:
                raise ConfigError(
                    f"parameter {jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)} cannot be split: "
                    f"dimension {dim} ({size}) over mesh axes {axes} ({ways} ways); choose mesh sizes that divide "
                    f"it, or change the mapping in mesh.rules")


def batch_sharding(mesh: Mesh, mesh_rules: Sequence[tuple[str, Any]]) -> NamedSharding:
    """Sharding of a [batch, seq] input array: batch over the axes the `batch` rule names."""
    spec = nn.logical_to_mesh_axes(("batch", "seq"), mesh_rules)
    return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())

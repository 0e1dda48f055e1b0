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

from transformer.config import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")


def mesh_shape(mesh_cfg: Any, num_devices: int) -> tuple[int, int, int]:
    """Resolves `-1` (all remaining devices) and checks the product equals the device count."""
    sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
    for axis, s in zip(MESH_AXES, sizes):
        if s == 0 or s < -1:
            raise ConfigError(f"mesh.{axis}={s} is not valid; use a positive size or -1 (all remaining devices)")
    if sizes.count(-1) > 1:
        raise ConfigError(f"mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(f"mesh {dict(zip(MESH_AXES, sizes))}: the fixed axes ({known}) do not divide "
                              f"the {num_devices} devices")
        sizes[sizes.index(-1)] = num_devices // known
    if int(np.prod(sizes)) != num_devices:
        raise ConfigError(f"mesh {dict(zip(MESH_AXES, sizes))} has {int(np.prod(sizes))} devices but "
                          f"{num_devices} are available; make mesh.data*mesh.fsdp*mesh.tensor = {num_devices} "
                          f"or set one axis to -1")
    return tuple(sizes)


def make_mesh(mesh_cfg: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape(mesh_cfg, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def rules(mesh_cfg: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_cfg.rules)


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

"""The sweep design: a sweep config expanded into runs (grid), its stages and their runs (plan), every sweep.*
key's default (defaults). Pure arithmetic on settings: imports the spec and scaling layers, never JAX, Flax,
optax or orbax, so `experiments.sweep --dry_run` runs where JAX does not import. The execution of a design
(transformer/sweeps/) sits above training."""

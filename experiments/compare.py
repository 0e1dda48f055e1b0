"""Judge a module change by its scaling: the compute multiplier of a variant sweep against a baseline sweep.

  python -m experiments.compare --baseline=DIR --variant=DIR --out=OUT [--at_flops=C] [--bootstrap=K] [--seed=S]

DIR: two finished IsoFLOP sweep directories of the same grid (experiments.sweep --workdir). Writes
OUT/compare.json (per budget and at --at_flops, default 4x the largest budget: the compute multiplier
C_base(L_var(C)) / C with its 95% interval, > 1: the variant is better; both fits' exponents and
frontiers; the loss differences) and OUT/compare.png, and prints a short summary.
"""
from __future__ import annotations

import os

from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from transformer import files
from transformer.spec import ConfigError
from transformer.scaling import compare, compare_plots

_BASELINE = DEFINE_path("baseline", None, "The baseline's sweep directory.")
_VARIANT = DEFINE_path("variant", None, "The variant's sweep directory (the same grid).")
_OUT = DEFINE_path("out", None, "Output directory for compare.json and compare.png.")
_AT_FLOPS = flags.DEFINE_float("at_flops", None, "The compute to extrapolate the multiplier to (default: "
                               f"{compare.AT_FLOPS_FACTOR:g}x the largest budget).")
_BOOTSTRAP = flags.DEFINE_integer("bootstrap", 200, "Loss-noise draws per sweep for the 95% intervals (0: none).",
                                  lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the noise draws.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r}; pass options as --name=value")
    for flag in (_BASELINE, _VARIANT, _OUT):
        if not flag.value:
            raise ConfigError(f"--{flag.name}=DIR is required")
    result = compare.compare(_BASELINE.value, _VARIANT.value, at_flops=_AT_FLOPS.value,
                             bootstrap=_BOOTSTRAP.value, seed=_SEED.value)
    os.makedirs(_OUT.value, exist_ok=True)
    files.write_json(os.path.join(_OUT.value, "compare.json"), result, indent=1, allow_nan=False)
    compare_plots.plot_compare(result, os.path.join(_OUT.value, "compare.png"))
    print(compare.summary(result))
    print(f"wrote {_OUT.value}/compare.json and {_OUT.value}/compare.png")


if __name__ == "__main__":
    cli.run(main)  # bad input (flags, directories, grids, unfinished sweeps) as one `error:` line, exit 2

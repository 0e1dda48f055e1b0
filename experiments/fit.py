"""Fit compute-optimal scaling laws (Chinchilla Approaches 1–3) to a sweep or a CSV of points.

  python -m experiments.fit (--sweep=DIR | --points=FILE.csv) --out=OUT \
      [--drop_highest=K] [--bootstrap=K] [--seed=S] [--n_kind=params|params_non_embedding]
      [--isoflop_window=W]

Writes OUT/fit.json and OUT/*.png and prints a short summary.
"""
from __future__ import annotations

import sys

from absl import flags

from experiments import cli

from transformer.scaling import points as points_lib
from transformer.scaling import report

_SWEEP = flags.DEFINE_string("sweep", None, "Sweep directory holding results.jsonl (and runs/*/metrics.jsonl).")
_POINTS = flags.DEFINE_string("points", None, "CSV with a header naming params, tokens, loss (optional flops).")
_OUT = flags.DEFINE_string("out", None, "Output directory for fit.json and the figures.")
_DROP_HIGHEST = flags.DEFINE_integer("drop_highest", 0, "Leave out the K highest-loss points.", lower_bound=0)
_BOOTSTRAP = flags.DEFINE_integer("bootstrap", 0, "Bootstrap resamples for 95% intervals (0: none).",
                                  lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the bootstrap resampling.")
_N_KIND = flags.DEFINE_enum("n_kind", "params", points_lib.N_KINDS, "Which parameter count is N (sweeps).")
_ISOFLOP_WINDOW = flags.DEFINE_integer(
    "isoflop_window", None,
    "Approach 2: fit each parabola to the lowest-loss size and this many neighbours per side "
    "(unset: all sizes of the budget).", lower_bound=1)


def _fail(message: str) -> None:
    print(f"fit: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        _fail(f"unexpected arguments {' '.join(argv[1:])!r}; pass options as --name=value")
    if (_SWEEP.value is None) == (_POINTS.value is None):
        _fail("give exactly one of --sweep=DIR or --points=FILE.csv")
    if not _OUT.value:
        _fail("--out=DIR is required")
    try:
        if _SWEEP.value is not None:
            points = points_lib.read_sweep(_SWEEP.value, n_kind=_N_KIND.value)
        else:
            points = points_lib.read_csv(_POINTS.value)
        fit = report.run_fit(
            points, _OUT.value, n_kind=_N_KIND.value,
            drop_highest=_DROP_HIGHEST.value, bootstrap=_BOOTSTRAP.value, seed=_SEED.value,
            isoflop_window=_ISOFLOP_WINDOW.value,
        )
    except (ValueError, OSError) as e:
        _fail(str(e))
    print(report.summary(fit))
    print(f"wrote {_OUT.value}/fit.json and {', '.join(fit.get('figures', []))}")


if __name__ == "__main__":
    cli.run(main)  # flag errors (e.g. --drop_highest=-1) as one `error:` line, exit 2

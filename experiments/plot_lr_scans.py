"""Draw learning-rate scans side by side, one panel per sweep, from each sweep's DIR/lr_fit.json.

  python -m experiments.plot_lr_scans --scans=DIR1,DIR2 [--titles=SP,μP] --out=FILE.png

E.g. the μP transfer measurement (configs/sweeps/mup_transfer.py): the same scan under the standard
parametrization and under μP. Prints each size's optimal learning rate and each fit's lr_opt = c·N^k.
"""
from __future__ import annotations

import json
import os

from absl import flags

from experiments import cli
from transformer.spec import ConfigError, MissingInputError
from transformer.scaling import lr_scan

_SCANS = flags.DEFINE_list("scans", None, "LR-scan sweep directories (each holding lr_fit.json).")
_TITLES = flags.DEFINE_list("titles", [], "One title per scan (default: the directory names).")
_OUT = flags.DEFINE_string("out", None, "The PNG to write.")


def main(argv: list[str]) -> None:
    del argv
    if not _SCANS.value or not _OUT.value:
        raise ConfigError("--scans=DIR[,DIR...] and --out=FILE.png are required")
    titles = _TITLES.value or [os.path.basename(os.path.normpath(d)) for d in _SCANS.value]
    if len(titles) != len(_SCANS.value):
        raise ConfigError(f"--titles has {len(titles)} entries for {len(_SCANS.value)} --scans")
    fits = []
    for d in _SCANS.value:
        path = os.path.join(d, "lr_fit.json")
        if not os.path.exists(path):
            raise MissingInputError(f"--scans: {path} does not exist (an LR-scan sweep writes it when it ends)")
        with open(path) as f:
            try:
                fit = json.load(f)
            except ValueError as e:  # a damaged or half-copied file
                raise ConfigError(f"--scans: {path} is not valid JSON ({e}); rerun that sweep's command to write it "
                                  f"again") from None
        if not isinstance(fit, dict) or not {"sizes", "coefficient", "exponent"} <= set(fit):
            raise ConfigError(f"--scans: {path} is not an LR scan's lr_fit.json (it needs sizes, coefficient and "
                              f"exponent)")
        fits.append(fit)
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    lr_scan.plot_panels(fits, titles, _OUT.value)
    for title, fit in zip(titles, fits):
        optima = ", ".join(f"{s['shape']} every rate diverged" if s["lr_opt"] is None else
                           f"{s['shape']} {s['lr_opt']:.3g}{' (edge)' if s['at_edge'] else ''}" for s in fit["sizes"])
        print(f"{title}: lr_opt {optima}; lr_opt = {fit['coefficient']:.3g}·N^{fit['exponent']:.3f}")
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    cli.run(main)

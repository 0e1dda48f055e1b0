"""The sweep's settings as one typed, frozen spec read once from the sweep config, and no ml_collections in the
library (issue 19 §1: only configs/ and experiments/ see it; everything below takes the spec or plain dicts)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from configs.sweeps import cpu, quick
from transformer.design import plan
from transformer.design.spec import SweepSpec
from transformer.spec import ConfigError

from import_graph import imported_modules

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_module_under_transformer_imports_ml_collections():
    files = [os.path.join(root, f) for root, _, names in os.walk(os.path.join(REPO, "transformer"))
             for f in names if f.endswith(".py")]
    assert len(files) > 100
    offenders = sorted(os.path.relpath(f, REPO) for f in files
                       if any(m.split(".")[0] == "ml_collections" for m in imported_modules(f)))
    assert not offenders, f"library modules that import ml_collections (only configs/ and experiments/ may): {offenders}"


BLOCK_ML_COLLECTIONS = """import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "ml_collections":
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Blocked())
"""


def test_a_sweep_is_designed_from_a_plain_dict_where_ml_collections_cannot_be_imported(tmp_path):
    """The design and the runner's document take a plain mapping (e.g. a sweep.json's sections): the same runs
    as from the ConfigDict, in a process where `import ml_collections` fails."""
    c = quick.get_config()
    expected = [r.run_id for r in plan.design(c, preview=True).runs]
    (tmp_path / "config.json").write_text(json.dumps(c.to_dict()))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_ML_COLLECTIONS)
    code = ("import json, sys\n"
            "from transformer.design import plan\n"
            "from transformer.sweeps import runner, execute, progress, run_groups, outcome\n"
            f"config = json.load(open({str(tmp_path / 'config.json')!r}))\n"
            "p = plan.design(config, preview=True)\n"
            "doc = runner.sweep_document(config, p)\n"
            "assert isinstance(execute.run_config('/tmp/x', doc['runs'][0]), dict)\n"
            "print(json.dumps([r['run_id'] for r in doc['runs']]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), REPO])}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == expected


def test_the_spec_is_frozen_typed_and_round_trips_through_sweep_json():
    c = cpu.get_config()
    spec = SweepSpec.of(c)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.budgets = (1.0,)
    assert spec.lr_calibration.d_models == (32, 56) and spec.seeds.extra == 2 and isinstance(spec.base, dict)
    doc = json.loads(json.dumps({"sweep": spec.settings(), "base": spec.base}))  # as sweep.json stores them
    assert SweepSpec.from_settings(doc["sweep"], doc["base"]) == spec
    assert SweepSpec.of(doc) == spec  # a plain mapping with the two sections, as the ConfigDict


@pytest.mark.parametrize("section, change, message", [
    ("sweep", dict(min_sizes=2), r"sweep\.min_sizes=2 must be at least 3"),
    ("sweep", dict(head_dim=0), r"sweep\.head_dim=0 must be a positive integer"),
    ("sweep", dict(budgets=(1e11, -1.0)), r"sweep\.budgets=\(100000000000\.0, -1\.0\) must be positive FLOP counts"),
    ("seeds", dict(bogus=1), r"unknown sweep setting\(s\) sweep\.seeds\.bogus; valid: sweep\.seeds\.budgets"),
    ("lr_calibration", dict(multipliers=(0.5, 1.0, 3.0)), r"sweep\.lr_calibration\.multipliers=.* evenly spaced"),
    ("schedule_check", dict(schedule="bogus"), r"sweep\.schedule_check\.schedule='bogus' is not valid"),
    ("sweep", dict(max_hours=-1.0), r"sweep\.max_hours=-1\.0 must be >= 0"),
    ("sweep", dict(budget_ratio=1.0), r"sweep\.budget_ratio=1\.0 must be > 1"),
])
def test_each_bad_setting_is_one_error_from_the_spec_constructor(section, change, message):
    c = cpu.get_config()
    (c.sweep if section == "sweep" else c.sweep[section]).update(change)
    with pytest.raises(ConfigError, match=message):
        SweepSpec.of(c)


def test_named_budgets_need_explicit_budgets():
    c = quick.get_config()  # its budgets are left to the sweep
    c.sweep.seeds.update(extra=1, budgets=(1e11,))
    with pytest.raises(ConfigError, match=r"sweep\.seeds\.budgets / sweep\.schedule_check\.budget name budgets, "
                                          r"but sweep\.budgets is empty"):
        SweepSpec.of(c)

"""transformer/environment.py records what a result was computed with, read independently here: the installed
versions (importlib against the packages' own __version__), the CPU model (lscpu), the checkout's commit (git)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from transformer import environment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_record_names_the_versions_the_machine_and_the_commit():
    import jax
    import numpy

    env = environment.record()
    json.dumps(env)  # JSON types only
    assert env["packages"]["jax"] == jax.__version__ and env["packages"]["numpy"] == numpy.__version__
    assert env["devices"] == {"backend": "cpu", "kind": jax.devices()[0].device_kind, "count": jax.device_count(),
                              "process_count": 1}
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), None)
        if model:
            assert env["cpu"]["model"] == model
        flags = next((ln.split(":", 1)[1].split() for ln in out.splitlines() if ln.startswith("Flags")), [])
        assert env["cpu"]["features"] == [f for f in environment.CPU_FEATURES if f in flags]
    assert env["xla_flags"].get("XLA_FLAGS") == os.environ.get("XLA_FLAGS")
    if shutil.which("git") and os.path.exists(os.path.join(REPO, ".git")):
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert env["git"]["commit"] == head and isinstance(env["git"]["dirty"], bool)


def test_a_fit_process_without_jax_records_no_devices():
    code = ("import sys, json; from transformer import environment; e = environment.record(); "
            "assert 'jax' not in sys.modules, 'environment imported jax'; print(json.dumps(e['devices']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "null"


def test_differences_that_move_figures_are_named():
    a = environment.record()
    b = json.loads(json.dumps(a))
    assert environment.describe_difference(a, b) == []
    b["cpu"] = {"model": "AMD EPYC 7B13", "features": ["avx2"], "count": 2}
    b["packages"]["jax"] = "0.0.1"
    diff = environment.describe_difference(a, b)
    assert any(d.startswith("jax ") for d in diff) and any(d.startswith("CPU '") for d in diff), diff
    assert any(d.startswith("CPU features") for d in diff) or a["cpu"]["features"] == ["avx2"], diff


def test_a_runs_summary_records_its_environment(tiny_lm_run):
    import jax

    with open(os.path.join(tiny_lm_run, "summary.json")) as f:
        env = json.load(f)["environment"]
    assert env["packages"]["jax"] == jax.__version__ and env["devices"]["backend"] == "cpu"
    assert env["cpu"] == environment.cpu()


def _sweep_rows(directory: str, cpus: list[str]) -> None:
    """A 3-budget × 4-size sweep's results.jsonl from a known law, each run's environment brief with its CPU."""
    import numpy as np

    rows, i = [], 0
    for budget in (1e12, 2e12, 4e12):
        for n in np.geomspace(2e4, 2e5, 4):
            d = budget / (6 * n)
            loss = 1.8 + 400 / n ** 0.34 + 400 / d ** 0.28
            env = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "cpu": cpus[i % len(cpus)],
                   "cpu_features": ["avx2"], "device": "cpu", "commit": None}
            rows.append({"run_id": f"r{i}", "budget": budget, "params": n, "params_non_embedding": n, "tokens": d,
                         "flops": budget, "eval_loss": loss, "status": "ok", "role": "grid", "environment": env})
            i += 1
    with open(os.path.join(directory, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("cpus", [["AMD EPYC 7B13"], ["AMD EPYC 7B13", "Intel(R) Xeon(R) Processor"]])
def test_a_fit_records_its_environment_and_the_runs_and_warns_when_they_differ(cpus, tmp_path):
    from transformer.scaling import report

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    _sweep_rows(str(sweep), cpus)
    fit = report.run_fit(str(sweep), str(tmp_path / "fit"), make_plots=False)
    with open(tmp_path / "fit" / "fit.json") as f:
        written = json.load(f)
    assert written["environment"]["packages"]["numpy"] == environment.record()["packages"]["numpy"]
    assert sorted(e["environment"]["cpu"] for e in written["run_environments"]) == sorted(set(cpus))
    assert sum(e["runs"] for e in written["run_environments"]) == 12
    warned = "WARNING: the fitted runs were computed in 2 environments" in report.summary(fit)
    assert warned == (len(cpus) > 1) and ("environment_warning" in written) == (len(cpus) > 1)

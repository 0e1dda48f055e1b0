"""configs/sweeps/gpu_quick.py (issue 30 §1): an IsoFLOP sweep for one H100 in 6 minutes: its plan (3 budgets × 4
sizes and the prediction at 4×, every run with non-embedding parameters ≥ N/2), its estimate from the H100 rates
(compilation and set-up included) under its limit, the dry run's epochs and its refusal of a plan over the limit;
`:cpu`, the same sweep shrunk, run to the checked prediction through the device stage script (slow)."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from configs.sweeps import gpu_quick
from transformer.design import grid, plan
from transformer.design.spec import SweepSpec
from transformer.spec import ConfigError
from transformer.sweeps import runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_S = 360.0


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "TRANSFORMER_HUGE_PAGES": "0",
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), **extra}


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300)


def _tokenizer_json(path: str, vocab: int) -> str:
    """A byte-level BPE tokenizer.json of `vocab` entries trained on generated words (a given tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghiklmnoprstuvwyz") for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(200)) for _ in range(400)],
                            trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<bos>", "<eos>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    return path


def _stdlib_jsonl(path: str, max_bytes: int) -> str:
    """The Python standard library's sources (tests left out) as one jsonl document per file, up to max_bytes."""
    used = 0
    root = sysconfig.get_paths()["stdlib"]
    with open(path, "w") as out:
        for d, dirs, files in sorted(os.walk(root)):
            dirs[:] = sorted(x for x in dirs if x not in ("test", "tests", "site-packages", "idlelib"))
            for name in sorted(f for f in files if f.endswith(".py")):
                with open(os.path.join(d, name), errors="replace") as f:
                    text = f.read()
                out.write(json.dumps({"text": text}) + "\n")
                used += len(text)
                if used >= max_bytes:
                    return path
    return path


def _packed() -> plan.Schedule:
    """How the sweep trains on its GPU (--parallel=0: workers share it), as a dry run without one assumes it."""
    return runner.schedule(SweepSpec.of(gpu_quick.get_config()).settings(), 0, assume=True)[0]


def test_the_plan_fits_one_h100_in_six_minutes_with_every_run_half_non_embedding():
    schedule = _packed()
    p = plan.design(gpu_quick.get_config(), preview=True, schedule=schedule)
    s = p.spec
    grid_runs = [r for r in p.runs if r.role == "grid"]
    assert len(s.budgets) >= 3 and all(sum(r.budget == c for r in grid_runs) >= 4 for c in s.budgets)
    validate = [r for r in p.runs if r.role == "validate"]
    assert len(validate) == 1 and validate[0].budget == pytest.approx(4 * max(s.budgets), rel=1e-2)
    assert all(r.params_non_embedding >= r.params / 2 for r in p.runs), [(r.run_id, r.params_non_embedding / r.params)
                                                                         for r in p.runs]
    assert 1e14 < min(s.budgets) and validate[0].budget < 1e17  # roughly 1e15-1e16: 1,000× the cpu sweep's
    base = s.base
    assert base["data"]["vocab_size"] >= 8192 and base["data"]["tokenizer"] == "sentencepiece"
    assert base["train"]["compute_dtype"] == "bfloat16"
    assert (base["model"]["positional"], base["model"]["norm"], base["model"]["activation"]) == ("rope", "rmsnorm",
                                                                                                  "swiglu")
    # one run after another, at the H100's measured rates, does not fit the 6 minutes (the H100 took 6.2 for the runs)
    one = plan.total_seconds(p.runs, s)
    assert one > s.max_hours * 3600 == LIMIT_S
    assert one == pytest.approx(sum(plan.estimate_seconds(r, s) for r in p.runs) + s.estimate_setup_s)
    # packed as --parallel=0 shares the GPU (the dry run without one assumes sweep.estimate_device_memory_gb=80),
    # stage by stage, compilation per run and the one-time set-up included, it does: what sweep.max_hours bounds
    packed = plan.total_seconds(p.runs, s, schedule)
    assert packed <= LIMIT_S < one
    no_compile = dataclasses.replace(s, estimate_compile_s=0.0, estimate_setup_s=0.0)
    assert packed - plan.total_seconds(p.runs, no_compile, schedule) >= s.estimate_compile_s + s.estimate_setup_s
    assert s.estimate_compile_s > 0 and s.estimate_setup_s > 0
    assert (s.estimate_device_memory_gb, s.estimate_pack_overlap) == (80.0, 0.0)  # the H100; the overlap unmeasured
    assert any(n.startswith("sweep.min_non_embedding_fraction=0.5: d_models 32, 64 left out") for n in p.notes)
    assert any(n.startswith("estimated time 3.8 min packed on an assumed 80 GB GPU, stage by stage") for n in p.notes)
    with pytest.raises(ConfigError, match=r"sweep.max_hours=0.1: .* is estimated at [\d.]+ min in one process "
                                          r"\(sweep.estimate_\*\), over its limit of 6.0 min"):
        plan.design(gpu_quick.get_config(), preview=True)  # one at a time: refused


def test_the_rates_are_the_ones_the_h100_run_measured():
    """The config's sweep.estimate_* are the device's own (docs/figures/gpu_quick_h100/gpu_quick_summary.txt: R, t0
    per step, compilation, evaluation and the rest per run), and with them the estimate of the 13 runs it trained
    (their sweep.json, one at a time) is within 15% of the 369 s they took (the bench-derived estimates before: 35%
    under)."""
    s = SweepSpec.of(gpu_quick.get_config())
    figures = os.path.join(REPO, "docs", "figures", "gpu_quick_h100")
    summary = open(os.path.join(figures, "gpu_quick_summary.txt")).read()
    m = re.search(r"R = ([\d.e+]+) FLOP/s, t0 = ([\d.]+) ms per step .* per run \(median\) ([\d.]+) s compilation, "
                  r"([\d.]+) s evaluation, ([\d.]+) s else", summary)
    r, t0, compile_s, eval_s, rest_s = (float(x) for x in m.groups())
    assert s.estimate_flops_per_second == pytest.approx(r, rel=1e-3)
    assert s.estimate_step_overhead_s == pytest.approx(t0 / 1e3, rel=1e-3)
    assert s.estimate_compile_s == pytest.approx(compile_s, abs=0.05)
    assert s.estimate_run_overhead_s == pytest.approx(eval_s + rest_s, abs=0.05)
    assert all(w in s.estimate_source for w in ("H100", "2026-11-26", "gpu_quick_h100/gpu_quick_summary.txt"))
    doc = json.load(open(os.path.join(figures, "sweep.json")))
    rows = [json.loads(line) for line in open(os.path.join(figures, "results.jsonl"))]
    runs = {r["run_id"]: r for r in doc["runs"]}
    step = lambda r: r["batch_size"] * r["seq_len"] * r["flops_per_token"] / s.estimate_flops_per_second  # noqa: E731
    estimate = sum((runs[row["run_id"]]["steps"] - runs[row["run_id"]]["start_step"]) * (
        step(runs[row["run_id"]]) + s.estimate_step_overhead_s) + s.estimate_compile_s + s.estimate_run_overhead_s
        for row in rows)
    took = sum(row["wall_seconds"] for row in rows)
    assert took == pytest.approx(369.0, abs=1.0) and estimate == pytest.approx(took, rel=0.15)


def test_the_cpu_variant_is_the_same_sweep_with_its_shapes_shrunk():
    """What :cpu changes is listed here; every other setting (the paths the device run takes) is the same."""
    gpu, cpu = SweepSpec.of(gpu_quick.get_config()), SweepSpec.of(gpu_quick.get_config("cpu"))
    shrunk = {"name", "d_models", "num_layers", "head_dim", "ffn_multiple", "min_steps", "max_hours"}  # and the rates
    differ = {f.name for f in dataclasses.fields(SweepSpec) if f.name != "base"
              and getattr(gpu, f.name) != getattr(cpu, f.name)}
    assert differ - {n for n in differ if n.startswith("estimate_")} == shrunk
    flat = lambda d, p="": {k: v for key, val in d.items() for k, v in (  # noqa: E731
        flat(val, f"{p}{key}.").items() if isinstance(val, dict) else [(p + key, val)])}
    g, c = flat(gpu.base), flat(cpu.base)
    assert {k for k in g if g[k] != c[k]} == {"data.vocab_size", "data.seq_len", "train.batch_size"}
    with pytest.raises(ConfigError, match="unknown variant 'gpu'"):
        gpu_quick.get_config("gpu")


def test_the_non_embedding_floor_leaves_out_narrow_shapes_and_refuses_named_ones():
    c = gpu_quick.get_config()
    lad = grid.ladder(SweepSpec.of(c))
    assert lad[0][0].d_model == 96 and all(grid.non_embedding_share(m) >= 0.5 for _, m in lad)
    # a size a setting names explicitly: refused, naming it
    c.sweep.lr_calibration.d_models = (64, 192)
    with pytest.raises(ConfigError, match=r"sweep.lr_calibration.d_models: d_model 64 .* 42% .* below "
                                          r"sweep.min_non_embedding_fraction=0.5"):
        plan.design(c, preview=True, schedule=_packed())
    # a ladder with no shape left, and values out of range
    c = gpu_quick.get_config()
    c.sweep.d_models = (32, 64)
    with pytest.raises(ConfigError, match="no shape of sweep.d_models keeps 50%"):
        plan.design(c, preview=True, schedule=_packed())
    for bad in (1.0, -0.1):
        c = gpu_quick.get_config()
        c.sweep.min_non_embedding_fraction = bad
        with pytest.raises(ConfigError, match="sweep.min_non_embedding_fraction"):
            SweepSpec.of(c)
    # the validation run's shape obeys it too: a predicted optimum below the ladder gets the smallest shape kept
    s = plan.design(gpu_quick.get_config(), preview=True, schedule=_packed()).spec
    run = plan.validation_run(s, {"flops": s.validate_flops, "params": 2e5, "convention": "total"}, grid.lr_rule(s))
    assert run.shape.d_model == 96 and run.params_non_embedding >= run.params / 2


@pytest.fixture(scope="module")
def given_data(tmp_path_factory):
    """A small jsonl corpus, a given 8,192-entry tokenizer.json and a token cache built from them."""
    root = tmp_path_factory.mktemp("gpu_quick_data")
    files = _stdlib_jsonl(str(root / "corpus.jsonl"), 1_500_000)
    args = [f"--config.base.data.files={files}", f"--config.base.data.tokenizer="
            f"{_tokenizer_json(str(root / 'tokenizer.json'), 8192)}", f"--config.base.data.cache_dir={root / 'cache'}",
            "--config.base.data.eval_fraction=0.05"]
    r = _cli("experiments.prepare_data", "--config=configs/sweeps/gpu_quick.py", *args)
    assert r.returncode == 0, r.stderr
    return root, args


def test_dry_run_prints_the_plan_epochs_and_the_estimate_under_the_limit(given_data):
    root, args = given_data
    r = _cli("experiments.sweep", "--config=configs/sweeps/gpu_quick.py", f"--workdir={root / 'sweep'}", "--dry_run",
             *args)
    assert r.returncode == 0, r.stderr
    assert "sweep gpu_quick (isoflop): 13 runs" in r.stdout
    stages = re.search(r"^epochs \(passes over the training split\), the most in each stage: (.*)$", r.stdout, re.M)
    assert stages and [s.split()[0] for s in stages.group(1).split(", ")] == ["C4.1e14", "C8.19e14", "C1.64e15",
                                                                              "validate"]
    assert "warning: 13 runs see their training data more than once" in r.stdout  # 1.5 MB of text: repeated
    assert "time limit: sweep.max_hours=0.1 h (6.0 min)" in r.stdout
    # what the limit bounds: the runs packed as --parallel=0 shares the GPU (assumed: none is visible here), and
    # against it, one at a time (over the 6 minutes)
    total = re.search(r"^total .*; estimated ([\d.]+) min packed on an assumed 80 GB GPU, stage by stage "
                      r"\(--parallel=0; sweep.estimate_device_memory_gb: no GPU is visible here\) "
                      r"\(one at a time: ([\d.]+) min\) at 2.89e\+14 FLOP/s .* s compilation per run \+ 10 s set-up "
                      r"\(sweep.estimate_\*: measured: this sweep on one H100", r.stdout, re.M)
    assert total and float(total.group(1)) < 6.0 < float(total.group(2)), r.stdout
    assert re.search(r"^note: estimated time [\d.]+ min packed on an assumed 80 GB GPU, stage by stage .*, within "
                     r"sweep.max_hours=0.1 h$", r.stdout, re.M), r.stdout
    assert not (root / "sweep").exists()


def test_dry_run_refuses_a_plan_over_the_limit_naming_the_estimate_and_the_limit(given_data):
    root, args = given_data
    r = _cli("experiments.sweep", "--config=configs/sweeps/gpu_quick.py", f"--workdir={root / 'sweep'}", "--dry_run",
             *args, "--config.sweep.max_hours=0.05")
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(r"sweep.max_hours=0.05: .* is estimated at [\d.]+ min packed on an assumed "
                                          r"80 GB GPU, stage by stage .*\(sweep.estimate_\*\), over its limit of "
                                          r"3.0 min", errors[0]), r.stderr
    # one at a time (--parallel=1) the 6 minutes do not hold it either
    r = _cli("experiments.sweep", "--config=configs/sweeps/gpu_quick.py", f"--workdir={root / 'sweep'}", "--dry_run",
             *args, "--parallel=1")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and re.search(
        r"sweep.max_hours=0.1: .* is estimated at [\d.]+ min in one process \(sweep.estimate_\*\), over its limit of "
        r"6.0 min", errors[0]), r.stderr
    assert not (root / "sweep").exists()


@pytest.mark.slow
def test_the_stage_script_runs_the_cpu_variant_to_the_checked_prediction(tmp_path):
    """.ci/gpu_stages/gpu_quick.sh with the :cpu config: the token cache, the plan, 13 runs, the fit, the prediction
    written before its run trains and then checked; $OUT holds the log, the summary and the packed sweep."""
    out = tmp_path / "out"
    files = _stdlib_jsonl(str(tmp_path / "corpus.jsonl"), 4_000_000)
    env = _env(OUT=str(out), GPU_QUICK_CONFIG="configs/sweeps/gpu_quick.py:cpu", GPU_QUICK_FILES=files,
               GPU_QUICK_SECONDS="1500", GPU_QUICK_ARGS=f"--config.base.data.cache_dir={tmp_path / 'cache'} --config.base.data.eval_fraction=0.05",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax"))
    r = subprocess.run(["bash", ".ci/gpu_stages/gpu_quick.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["gpu_quick.log", "gpu_quick.tgz", "gpu_quick_summary.txt"]
    summary = (out / "gpu_quick_summary.txt").read_text()
    assert "13 of 13 runs ok" in summary and re.search(r"^fit approach2 \(\w+\): a = -?[\d.]+", summary, re.M), summary
    assert re.search(r"^prediction check at [\d.e+]+ FLOPs \(d\d+-L3-[^)]*-validate-\w+\): predicted [\d.]+", summary,
                     re.M), summary
    assert "measured rates (13 runs" in summary
    with tarfile.open(out / "gpu_quick.tgz") as tar:
        names = tar.getnames()
        assert not [n for n in names if "checkpoints" in n]
        doc = json.load(tar.extractfile("gpu_quick/sweep.json"))
        check = json.load(tar.extractfile("gpu_quick/fit/validation.json"))
        assert "gpu_quick/fit/predictions.json" in names and "gpu_quick/results.jsonl" in names
    assert len(doc["runs"]) == 13 and all(r["params_non_embedding"] >= r["params"] / 2 for r in doc["runs"])
    assert check["measured_loss"] is not None and check["prediction_written_at"]
    log = (out / "gpu_quick.log").read_text()
    assert 0 <= log.index("prediction written to") < log.index(f"start {check['run_id']}"), "the prediction first"
    assert "epochs (passes over the training split), the most in each stage: C" in log  # the dry run, cache built

"""Every command accepts relative paths for every path argument (issue 20 §1), run as a user runs them: from a
working directory that is not the repository, with relative --workdir/--out/--sweep/... flags and relative
data.files, data.tokenizer, data.cache_dir and train.init_from settings (experiments/_paths.py makes them absolute
once, at the command line). One tiny run, trained by the first test's command, serves the commands after it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_compare import write_sweep_dir
from test_data_files import train_hf_tokenizer
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [f"def function_{i}(x):\n    return x * {i} + {i % 7}\n" * 8 for i in range(24)]
TINY = ["--config.train.steps=2", "--config.train.warmup_steps=1", "--config.train.batch_size=4",
        "--config.data.seq_len=32", "--config.train.eval_every=2", "--config.train.eval_steps=1",
        "--config.train.checkpoint_every=2", "--config.train.log_every=1", "--config.data.eval_fraction=0.25"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> str:
    """A user's working directory, outside the repository: data/*.txt, tok.json (a BPE tokenizer.json)."""
    root = tmp_path_factory.mktemp("user")
    (root / "data").mkdir()
    for i, text in enumerate(TEXTS):
        (root / "data" / f"f{i:02d}.txt").write_text(text)
    train_hf_tokenizer(str(root / "tok.json"), TEXTS)
    return str(root)


def _run(home: str, module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "TRANSFORMER_HUGE_PAGES": "0",
           "XLA_FLAGS": xla_flags(1)}
    proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], cwd=home, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"experiments.{module} {' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _config(home: str) -> str:
    """The config file by a relative path too (from the user's directory into the checkout)."""
    return "--config=" + os.path.relpath(os.path.join(REPO, "configs", "lm.py"), home) + ":gpt2_tiny"


def _data_flags(prefix: str = "config") -> list[str]:
    return [f"--{prefix}.data.files=data/*.txt", f"--{prefix}.data.tokenizer=tok.json",
            f"--{prefix}.data.cache_dir=cache"]


@pytest.fixture(scope="module")
def run(home) -> str:
    """experiments.train with a relative --workdir and relative data, tokenizer and cache settings."""
    _run(home, "train", _config(home), "--workdir=runs/tiny", *_data_flags(), *TINY)
    return os.path.join(home, "runs", "tiny")


def test_train_records_absolute_paths(home, run):
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["status"] == "ok" and summary["step"] == 2
    data = json.load(open(os.path.join(run, "config.json")))["data"]
    assert (data["files"], data["tokenizer"], data["cache_dir"]) == (
        os.path.join(home, "data", "*.txt"), os.path.join(home, "tok.json"), os.path.join(home, "cache"))
    assert os.path.isdir(os.path.join(home, "cache", "tokens"))


def test_sample(home, run):
    out = _run(home, "sample", "--workdir=runs/tiny", "--prompt=def", "--max_new_tokens=3").stdout
    assert "--- sample 1/1 (step 2" in out


def test_attention(home, run):
    _run(home, "attention", "--workdir=runs/tiny", "--text=def f", "--out=maps", "--layers=0")
    assert "attention.npz" in os.listdir(os.path.join(home, "maps"))


@pytest.mark.slow
def test_export(home, run):
    _run(home, "export", "--workdir=runs/tiny", "--out=hf")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(os.path.join(home, "hf")))


@pytest.mark.slow  # a second training run (the compile dominates)
def test_fine_tune_from_a_relative_init_from(home, run):
    out = _run(home, "train", _config(home), "--workdir=runs/tuned", "--config.train.init_from=runs/tiny",
               *_data_flags(), *TINY).stdout
    assert "warm start from " + run in out
    assert json.load(open(os.path.join(home, "runs", "tuned", "config.json")))["train"]["init_from"] == run


def test_prepare_data(home, run):
    out = _run(home, "prepare_data", _config(home), *_data_flags()).stdout
    assert json.loads(out.strip().splitlines()[-1])["cache"].startswith(os.path.join(home, "cache", "tokens"))


def test_sweep_dry_run(home):
    sweep = "--config=" + os.path.relpath(os.path.join(REPO, "configs", "sweeps", "quick.py"), home)
    out = _run(home, "sweep", sweep, "--workdir=sweeps/quick", "--dry_run", *_data_flags("config.base")).stdout
    assert "runs would train" in out and not os.path.exists(os.path.join(home, "sweeps"))


@pytest.mark.slow  # these two read relative paths correctly before too: a guard, not a fix (~15 s unloaded)
def test_fit_and_compare(home):
    write_sweep_dir(os.path.join(home, "base"), seed=0)  # synthetic finished sweeps (sweep.json, results.jsonl)
    write_sweep_dir(os.path.join(home, "variant"), seed=1)
    _run(home, "fit", "--sweep=base", "--out=fit", "--bootstrap=0")
    assert os.path.isfile(os.path.join(home, "fit", "fit.json"))
    _run(home, "compare", "--baseline=base", "--variant=variant", "--out=cmp", "--bootstrap=0")
    assert os.path.isfile(os.path.join(home, "cmp", "compare.json"))

"""`experiments.train --dry_run`: the config a real run would resolve and write (DIR/config.json), the same
checks, exit 0, and nothing trained or written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config=configs/lm.py:gpt2_tiny", "--config.data.seq_len=32", "--config.train.steps=4",
        "--config.train.warmup_steps=1", "--config.train.batch_size=8", "--config.train.eval_every=4",
        "--config.train.eval_steps=1", "--config.train.checkpoint_every=2", "--config.train.log_every=2"]


def _train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "TRANSFORMER_HUGE_PAGES": "0"}
    return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _printed_config(stdout: str) -> dict:
    return json.JSONDecoder().raw_decode(stdout)[0]


def _tree(root: str) -> dict[str, float]:
    return {os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
            for d, _, fs in os.walk(root) for f in fs}


def test_dry_run_prints_what_a_real_run_writes_and_writes_nothing(tiny_lm_run, corpus_dir):
    """The fixture's run was trained with these settings: the dry run's config is its config.json, to the key."""
    before = _tree(tiny_lm_run)
    r = _train(*TINY, f"--config.data.data_dir={corpus_dir}", f"--workdir={tiny_lm_run}", "--dry_run")
    assert r.returncode == 0, r.stderr
    with open(os.path.join(tiny_lm_run, "config.json")) as f:
        assert _printed_config(r.stdout) == json.load(f)
    assert "a real run resumes it" in r.stdout
    assert "nothing trained, nothing written" in r.stdout
    assert _tree(tiny_lm_run) == before


def test_dry_run_resolves_checks_and_leaves_no_workdir(tmp_path):
    workdir = tmp_path / "new_run"
    r = _train(*TINY, "--config.model.num_layers=3", f"--workdir={workdir}", "--dry_run")
    assert r.returncode == 0, r.stderr
    config = _printed_config(r.stdout)
    assert config["model"]["num_layers"] == 3 and config["train"]["steps"] == 4
    assert config["model"]["vocab_size"] == 384  # 0 in the preset: the byte tokenizer's 259 ids padded to 128s
    assert "a new run" in r.stdout
    assert not workdir.exists() and not list(tmp_path.iterdir())
    # the same checks as a real run, before anything: a bad setting is one error line, exit 2
    r = _train(*TINY, "--config.model.positional=xpos", "--dry_run")
    assert r.returncode == 2 and "model.positional='xpos'" in r.stderr, r.stderr
    # and a real run still needs its workdir
    r = _train(*TINY)
    assert r.returncode == 2 and "--workdir=DIR is required" in r.stderr, r.stderr


def test_dry_run_refuses_another_runs_workdir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"train": {"steps": 7}}))
    r = _train(*TINY, f"--workdir={tmp_path}", "--dry_run")
    assert r.returncode == 2 and "holds a different run's config" in r.stderr, r.stderr

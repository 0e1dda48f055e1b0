"""Bad input on every command line: exit status 2, one short `error:` message naming the setting
(and the valid values where there is a short list), no traceback, and no existing file changed."""
from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["experiments.train", "--config=configs/lm.py:gpt2_tiny", "--workdir={work}/run",
         "--config.data.data_dir={data}", "--config.train.warmup_steps=1"]
SWEEP = ["experiments.sweep", "--config=configs/sweeps/quick.py", "--workdir={work}/sweep",
         "--config.base.data.data_dir={data}"]
FIT = ["experiments.fit", "--out={work}/fit"]
SAMPLE = ["experiments.sample", "--workdir={work}/never_created"]

# (id, command, regex the message must match)
CASES = [
    ("train_unknown_key", TRAIN + ["--config.model.nonexistent=3"],
     r"--config\.model\.nonexistent: 'nonexistent' is not a setting.*valid keys under model: .*d_model"),
    ("train_unknown_section", TRAIN + ["--config.optim.lr=3"], r"'optim' is not a setting.*valid keys: .*train"),
    ("train_misspelt_key", TRAIN + ["--config.train.step=30"],  # clean text: no quoted repr, no literal \n
     r"^error: --config\.train\.step: 'step' is not a setting of this config \(did you mean 'train\.steps'\?\); "
     r"valid keys under train: [a-z_0-9, ]*\bsteps\b[a-z_0-9, ]*$"),
    ("train_wrong_type", TRAIN + ["--config.train.steps=abc"], r"--config\.train\.steps=abc: invalid literal for int"),
    ("train_float_for_int", TRAIN + ["--config.train.batch_size=1.5"], r"--config\.train\.batch_size=1\.5"),
    ("train_bad_bool", TRAIN + ["--config.model.tie_embeddings=maybe"], r"--config\.model\.tie_embeddings=maybe"),
    ("train_zero_steps", TRAIN + ["--config.train.steps=0"], r"train\.steps=0 must be a positive integer"),
    ("train_negative_lr", TRAIN + ["--config.train.learning_rate=-0.1"], r"train\.learning_rate=-0\.1 must be positive"),
    ("train_zero_seq_len", TRAIN + ["--config.data.seq_len=0"], r"data\.seq_len=0 must be a positive integer"),
    ("train_bad_choice", TRAIN + ["--config.train.nonfinite=maybe"], r"train\.nonfinite='maybe'.*one of stop, skip"),
    ("train_bad_schedule", TRAIN + ["--config.train.schedule=step"], r"train\.schedule='step'.*cosine, linear, constant"),
    ("train_bad_positional", TRAIN + ["--config.model.positional=xpos"], r"model\.positional='xpos'.*rope"),
    ("train_unknown_preset", ["experiments.train", "--config=configs/lm.py:gpt5", "--workdir={work}/run"],
     r"--config: unknown preset 'gpt5'.*valid presets: .*gpt2_tiny"),
    ("train_missing_config_file", ["experiments.train", "--config=configs/nope.py", "--workdir={work}/run"],
     r"--config: .*No such file.*configs/nope\.py"),
    ("train_missing_workdir_flag", ["experiments.train", "--config=configs/lm.py:gpt2_tiny"], r"--workdir"),
    ("train_bad_mesh", TRAIN + ["--config.mesh.data=3"], r"mesh .*has 3 devices but 8 are available"),
    ("train_batch_not_divisible", TRAIN + ["--config.train.batch_size=6"],
     r"train\.batch_size=6 must be divisible by the data-parallel size 8"),
    ("train_missing_dataset", TRAIN + ["--config.data.tfds_name=no_such_dataset"], r"no_such_dataset"),
    ("train_other_runs_workdir", TRAIN + ["--workdir={work}/other_run"], r"holds a different run's config"),
    ("train_unknown_flag", TRAIN + ["--stepz=3"], r"Unknown command line flag 'stepz'"),
    ("sweep_unknown_key", SWEEP + ["--config.sweep.bogus=1"], r"'bogus' is not a setting.*valid keys under sweep"),
    # (--parallel=0 is valid since the sweep packs runs: it chooses; a negative count is the fault trial's case)
    ("sweep_bad_parallel", SWEEP + ["--parallel=two"], r"flag --parallel=two: invalid literal for int\(\)"),
    ("sweep_missing_sweep_json", ["experiments.sweep", "--workdir={work}/empty", "--run_index=0"],
     r"sweep\.json: no such file"),
    ("sweep_unknown_launcher", SWEEP + ["--launcher=k8s"], r"--launcher"),
    ("fit_missing_csv", FIT + ["--points={work}/nope.csv"], r"nope\.csv"),
    ("fit_csv_without_loss", FIT + ["--points={work}/no_loss.csv"], r"loss"),
    ("fit_both_sources", FIT + ["--points={work}/no_loss.csv", "--sweep={work}/sweep"], r"exactly one of"),
    ("fit_negative_drop", FIT + ["--points={work}/no_loss.csv", "--drop_highest=-1"], r"--drop_highest"),
    ("fit_nonpositive_params", FIT + ["--points={work}/zero_params.csv"], r"params"),
    ("sample_missing_workdir", SAMPLE + ["--prompt=hi"], r"does not exist"),
    ("sample_zero_samples", ["experiments.sample", "--workdir={work}/other_run", "--num_samples=0"],
     r"--num_samples=0 must be a positive integer"),
]


def _prepare(work: str) -> None:
    """Files a careless command could damage: another run's workdir, CSVs, a sweep dir."""
    os.makedirs(os.path.join(work, "other_run"), exist_ok=True)
    with open(os.path.join(work, "other_run", "config.json"), "w") as f:
        json.dump({"train": {"steps": 7}, "model": {"family": "decoder"}}, f)
    with open(os.path.join(work, "other_run", "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "train_loss": 5.0}\n')
    with open(os.path.join(work, "no_loss.csv"), "w") as f:
        f.write("params,tokens\n1000,20000\n2000,40000\n")
    with open(os.path.join(work, "zero_params.csv"), "w") as f:
        f.write("params,tokens,loss\n0,20000,3.0\n1000,40000,2.9\n2000,80000,2.8\n")
    os.makedirs(os.path.join(work, "empty"), exist_ok=True)


def _snapshot(root: str) -> dict[str, str]:
    return {os.path.relpath(p, root): hashlib.sha1(open(p, "rb").read()).hexdigest()
            for p in glob.glob(os.path.join(root, "**"), recursive=True) if os.path.isfile(p)}


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("TRANSFORMER_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


# What _prepare writes; the cases whose command line names one of these are the ones aimed at existing files.
PREPARED = ("other_run", "no_loss.csv", "zero_params.csv", "empty")
AIMED_AT_FILES = [cid for cid, args, _ in CASES if any(f"{{work}}/{name}" in a for a in args for name in PREPARED)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus_dir) -> tuple[str, str, dict[str, str], dict]:
    """(work dir with the prepared files, data dir, their hashes before any case ran, results so far)."""
    work = str(tmp_path_factory.mktemp("bad"))
    _prepare(work)
    return work, corpus_dir, _snapshot(work), {}


def _outcomes(prepared, case_ids: list[str]) -> tuple[dict, dict[str, str], dict[str, str]]:
    """Runs the cases not run yet (two at a time), all against the same prepared files: (results of
    `case_ids`, hashes before, hashes after)."""
    work, data, before, results = prepared
    todo = {cid: [a.format(work=work, data=data) for a in args] for cid, args, _ in CASES
            if cid in case_ids and cid not in results}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results.update(zip(todo, pool.map(_run, todo.values())))
    return {cid: results[cid] for cid in case_ids}, before, _snapshot(work)


@pytest.fixture(scope="module")
def outcomes(prepared):
    """Every case run; each sees the same prepared files, hashed before and after."""
    return _outcomes(prepared, [c[0] for c in CASES])


@pytest.mark.slow
@pytest.mark.parametrize("case_id, args, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_cleanly(outcomes, case_id, args, pattern):
    import re

    results, _, _ = outcomes
    r = results[case_id]
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if "error:" in line]
    # one line, not a dump; the longest is the sweep's list of its 52 valid keys (about 820 characters)
    assert len(errors) == 1 and len(errors[0]) < 1200, text
    assert re.search(pattern, errors[0]), errors[0]


@pytest.mark.slow  # CI's 15 minutes: 16 s of the default run on 2 loaded cores (2026-11-27)
def test_bad_inputs_leave_existing_files_intact(prepared):
    """The cases that name an existing file (another run's workdir, the CSVs, an empty sweep dir) change none;
    every case's command line, and that no case changes a file, are the slow tests'."""
    results, before, after = _outcomes(prepared, AIMED_AT_FILES)
    assert len(results) == len(AIMED_AT_FILES) >= 6 and all(r.returncode == 2 for r in results.values())
    assert {k: v for k, v in after.items() if k in before} == before
    assert len(CASES) >= 20


@pytest.mark.slow
def test_no_bad_input_changes_an_existing_file(outcomes):
    """test_bad_inputs_leave_existing_files_intact over every case, the ones that name no existing file too."""
    _, before, after = outcomes
    assert {k: v for k, v in after.items() if k in before} == before

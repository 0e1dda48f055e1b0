"""The fault trial of issue 29, its cheap part: what a user gets for a mistyped command line, a read-only, full or
forbidden directory, a damaged file, a path with spaces and Unicode in it (the kills, the concurrent commands,
the divergences and the faults that need a trained run are in test_fault_trial_slow.py).

A user's mistake — every command line of MISTAKES, each new (tests/test_bad_inputs.py, test_cli_errors.py,
test_data_mistakes.py, test_export.py, test_compare.py, test_sweep.py hold the others) — gives exit status 2,
exactly one `error:` line naming the setting or the path, no traceback, and writes nothing: no file or directory
appears, changes or goes under the trial's directory. An error of the environment (ENVIRONMENT: a read-only file
system, a full disk, a directory the user may not write) is the same one line, naming the path and the cause.
A case not fixed yet is marked xfail(strict) saying what is wrong (it fails until the fix, then the mark goes).
A pattern asks for what the line must say (the setting or path,
the cause), not one wording: the branches that check earlier word their messages their own way. Every case runs as `python -m experiments.X` in a process of its
own, forked from one that imported the heavy libraries once (tests/fault_runner.py: about 0.3-1 s a case instead
of 3-5 s), started in the trial's directory: a relative path a command makes (`~nouser/run` taken literally)
lands where the check sees it.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import NamedTuple

import pytest

from fault_runner import REPO, error_lines, run_commands

TRAIN = ["experiments.train", "--config={repo}/configs/lm.py:gpt2_tiny", "--config.data.data_dir={data}"]
DRY = TRAIN + ["--dry_run"]
SMALL = ["--config.train.steps=2", "--config.train.warmup_steps=1", "--config.data.seq_len=32",
         "--config.train.batch_size=8"]


def real(workdir: str) -> list[str]:
    """A real (not dry) run of two small steps in {work}/WORKDIR: each case its own, so that a case that writes
    (a bug) cannot change what the next one sees."""
    return TRAIN + SMALL + [f"--workdir={{work}}/{workdir}"]

SWEEP = ["experiments.sweep", "--config={repo}/configs/sweeps/quick.py", "--config.base.data.data_dir={data}",
         "--workdir={work}/new_sweep", "--dry_run"]
FIT = ["experiments.fit", "--points={work}/points.csv", "--out={work}/new_fit"]
COMPARE = ["experiments.compare", "--baseline={work}/empty", "--variant={work}/empty", "--out={work}/new_compare"]
PREPARE = ["experiments.prepare_data", "--config={repo}/configs/lm.py:gpt2_tiny", "--config.data.data_dir={data}"]
LOCAL = ["--config.data.tfds_name=", "--config.data.files={work}/dïr with space/*.txt"]  # local files, for a cache
PLOT = ["experiments.plot_lr_scans", "--out={work}/new_plot.png"]

def open_finding(what: str) -> str:
    return f"not fixed on any branch of issue 29 yet: {what}"


class Case(NamedTuple):
    id: str
    argv: list[str]
    pattern: str              # the one error line must match it (re.search)
    xfail: str | None = None  # why it fails today (open_finding), until it is fixed
    env: dict[str, str] | None = None  # set in the case's process


# A PATH without SLURM's commands (the case of a machine without SLURM, also where CI runs a cluster)
NO_SLURM = {"PATH": os.path.dirname(sys.executable) + os.pathsep + "/nonexistent"}

MISTAKES = [
    # ---- train: settings that are nonsense (issue 29 item 1.9 and its kind)
    Case("train_b2_above_1", DRY + ["--config.train.b2=1.5"], r"train\.b2=1\.5"),
    Case("train_b1_of_1", DRY + ["--config.train.b1=1.0"], r"train\.b1=1\.0"),
    Case("train_negative_weight_decay", DRY + ["--config.train.weight_decay=-0.1"], r"train\.weight_decay=-0\.1"),
    Case("train_infinite_lr", DRY + ["--config.train.learning_rate=inf"], r"train\.learning_rate=inf"),
    Case("train_nan_lr", DRY + ["--config.train.learning_rate=nan"], r"train\.learning_rate=nan must be positive"),
    Case("train_negative_eps", DRY + ["--config.train.eps=-1"], r"train\.eps=-1"),
    Case("train_negative_norm_eps", DRY + ["--config.model.norm_eps=-1"], r"model\.norm_eps=-1"),
    Case("train_negative_batch", DRY + ["--config.train.batch_size=-8"], r"train\.batch_size=-8 must be a positive"),
    Case("train_heads_not_dividing", DRY + ["--config.model.num_heads=5"], r"model\.num_heads=5 does not divide"),
    Case("train_kv_heads_not_dividing", DRY + ["--config.model.num_kv_heads=3"], r"model\.num_kv_heads=3"),
    Case("train_zero_layers", DRY + ["--config.model.num_layers=0"], r"model\.num_layers=0 must be a positive"),
    Case("train_negative_d_ff", DRY + ["--config.model.d_ff=-1"], r"model\.d_ff=-1"),
    Case("train_zero_max_len", DRY + ["--config.model.max_len=0"], r"model\.max_len=0"),
    Case("train_unknown_family", DRY + ["--config.model.family=rnn"], r"model\.family='rnn'"),
    Case("train_unknown_norm", DRY + ["--config.model.norm=batchnorm"], r"model\.norm='batchnorm'.*rmsnorm"),
    Case("train_misspelt_activation", DRY + ["--config.model.activation=tanhh"], r"model\.activation='tanhh'.*swiglu"),
    Case("train_unknown_norm_position", DRY + ["--config.model.norm_position=middle"], r"model\.norm_position="),
    Case("train_unknown_attention", DRY + ["--config.model.attention_impl=flash9"], r"model\.attention_impl="),
    Case("train_dropout_of_1.5", DRY + ["--config.model.dropout_rate=1.5"], r"model\.dropout_rate=1\.5"),
    Case("train_unknown_compute_dtype", DRY + ["--config.train.compute_dtype=float7"], r"train\.compute_dtype="),
    Case("train_zero_eval_every", DRY + ["--config.train.eval_every=0"], r"train\.eval_every=0"),
    Case("train_negative_checkpoint_every", DRY + ["--config.train.checkpoint_every=-1"],
         r"train\.checkpoint_every=-1"),
    Case("train_zero_keep_checkpoints", DRY + ["--config.train.keep_checkpoints=0"], r"train\.keep_checkpoints=0"),
    Case("train_negative_grad_clip", DRY + ["--config.train.grad_clip=-1"], r"train\.grad_clip=-1"),
    Case("train_decay_fraction_1.5", DRY + ["--config.train.schedule=wsd", "--config.train.decay_fraction=1.5"],
         r"train\.decay_fraction=1\.5"),
    Case("train_unknown_eval_split", DRY + ["--config.data.eval_split=nope"], r"split 'nope'.*train, validation"),
    # ---- train: a task the family does not support (item 1.1)
    Case("train_lm_task_on_an_encoder", ["experiments.train", "--config={repo}/configs/mlm.py:bert_tiny",
                                         "--config.data.data_dir={data}", "--config.train.task=lm", "--dry_run"],
         r"train\.task='lm'"),
    Case("train_mlm_task_on_a_decoder", DRY + ["--config.train.task=mlm"], r"train\.task='mlm'"),
    Case("train_span_task_on_a_decoder", DRY + ["--config.train.task=span_corruption"],
         r"train\.task='span_corruption'"),
    # ---- train: bad input that a real run checks only after writing config.json (item 2.3), or not at all (2.5)
    Case("train_init_from_missing", real("run_init") + ["--config.train.init_from={work}/nope"], r"train\.init_from"),
    Case("train_init_from_an_empty_dir", real("run_init_empty") + ["--config.train.init_from={work}/empty"],
         r"train\.init_from='.*/empty': .*empty/config\.json not found"),
    Case("train_loss_chunk_not_dividing", real("run_chunk") + ["--config.train.loss_chunk_size=7"],
         r"train\.loss_chunk_size=7"),
    Case("train_negative_shuffle_seed", real("run_shuffle") + ["--config.data.shuffle_seed=-1"],
         r"data\.shuffle_seed=-1"),
    Case("train_half_written_config_json", TRAIN + ["--workdir={work}/damaged_run"], r"damaged_run/config\.json"),
    # ---- the command line itself (experiments/cli.py, experiments/_paths.py)
    Case("train_positional_argument", DRY + ["steps=30"], r"unexpected argument.*'steps=30'.*--name=value"),
    Case("train_bool_given_a_separate_value", DRY + ["true"], r"unexpected argument.*'true'"),
    Case("train_empty_workdir", TRAIN + ["--workdir="], r"--workdir=DIR is required"),
    Case("train_config_not_python", ["experiments.train", "--config={work}/points.csv", "--workdir={work}/new_run"],
         r"--config=.*points\.csv is not a config file"),
    Case("train_config_a_directory", ["experiments.train", "--config={work}/empty", "--workdir={work}/new_run"],
         r"--config: .*Is a directory: '.*/empty'"),
    Case("train_workdir_is_a_file", TRAIN + SMALL + ["--workdir={work}/a_file"],
         r"--workdir=\S*a_file: .*not a directory"),
    Case("train_workdir_under_a_file", TRAIN + SMALL + ["--workdir={work}/a_file/run"],
         r"--workdir=\S*a_file/run: .*(is a file|a_file is not a directory)"),
    Case("train_workdir_of_no_user", DRY + ["--workdir=~no_such_user_zz/run"],
         r"--workdir=~no_such_user_zz/run: ~no_such_user_zz is no user's home"),
    Case("train_workdir_unexpanded_variable", DRY + ["--workdir=$NO_SUCH_SCRATCH_ZZ/run"],
         r"--workdir=\$NO_SUCH_SCRATCH_ZZ/run: \$NO_SUCH_SCRATCH_ZZ is a shell variable that was not expanded"),
    Case("train_cache_dir_unexpanded_variable", DRY + ["--config.data.cache_dir=${{NO_SUCH_ZZ}}/cache"],
         r"data\.cache_dir='\$\{NO_SUCH_ZZ\}/cache': \$\{NO_SUCH_ZZ\} is a shell variable"),
    Case("train_dry_run_given_a_value", TRAIN + ["--dry_run=maybe"], r"--dry_run=maybe.*Non-boolean"),
    # ---- sweep
    Case("sweep_positional_argument", SWEEP + ["quick"], r"unexpected argument.*'quick'"),
    Case("sweep_negative_min_steps", SWEEP + ["--config.sweep.min_steps=-1"], r"sweep\.min_steps=-1"),
    Case("sweep_budget_not_a_number", SWEEP + ["--config.sweep.budgets=abc"], r"sweep\.budgets=\('abc',\)"),
    Case("sweep_negative_parallel", SWEEP + ["--parallel=-1"], r"--parallel=-1 must be 0"),
    Case("sweep_given_a_training_config", ["experiments.sweep", "--config={repo}/configs/lm.py:gpt2_tiny",
                                           "--workdir={work}/new_sweep"], r"needs a `sweep` section"),
    Case("sweep_negative_max_hours", SWEEP + ["--config.sweep.max_hours=-1"], r"sweep\.max_hours=-1"),
    Case("sweep_no_shapes", SWEEP + ["--config.sweep.d_models=()"], r"sweep\.d_models has 0 shapes"),
    Case("sweep_size_span_below_1", SWEEP + ["--config.sweep.size_span=0.5"], r"sweep\.size_span=0\.5 must be > 1"),
    Case("sweep_negative_lr_max", SWEEP + ["--config.sweep.lr_max=-1"], r"sweep\.lr_max"),
    Case("sweep_workdir_is_a_file", SWEEP[:-2] + ["--workdir={work}/a_file"], r"--workdir=\S*a_file: .*(is a file|Not a directory)"),
    Case("sweep_slurm_without_sbatch", SWEEP[:-1] + ["--launcher=slurm"], r"--launcher=slurm: `sbatch` is not on",
         env=NO_SLURM),
    # ---- fit
    Case("fit_flops_not_a_number", FIT + ["--predict_flops=abc"], r"--predict_flops: 'abc' is not a number"),
    Case("fit_point_without_colon", FIT + ["--predict_points=1e6"], r"--predict_points: '1e6' is not N:D"),
    Case("fit_missing_points_csv", FIT + ["--predict_points_csv={work}/nope.csv"], r"--predict_points_csv=.*nope"),
    Case("fit_where_without_equals", FIT + ["--where=foo"], r"--where='foo': expected COLUMN=VALUE"),
    Case("fit_where_unknown_column", FIT + ["--where=model=x"], r"--where names column 'model'"),
    Case("fit_where_on_a_sweep", ["experiments.fit", "--sweep={work}/empty", "--where=a=b", "--out={work}/new_fit"],
         r"--where filters the rows of --points"),
    Case("fit_unknown_isoflop_method", FIT + ["--isoflop_method=bogus"], r"--isoflop_method=bogus.*akima"),
    Case("fit_unknown_headline", FIT + ["--headline=bogus"], r"--headline=bogus"),
    Case("fit_negative_near", FIT + ["--approach3_near=-1"], r"--approach3_near=-1"),
    Case("fit_unknown_n_kind", FIT + ["--n_kind=foo"], r"--n_kind=foo"),
    Case("fit_zero_window", FIT + ["--isoflop_window=0"], r"--isoflop_window=0"),
    Case("fit_no_out", ["experiments.fit", "--points={work}/points.csv"], r"--out=DIR is required"),
    Case("fit_loss_not_a_number", ["experiments.fit", "--points={work}/text_loss.csv", "--out={work}/new_fit"],
         r"text_loss\.csv: row 2, column 'loss' = 'abc'"),
    Case("fit_empty_csv", ["experiments.fit", "--points={work}/empty.csv", "--out={work}/new_fit"],
         r"empty\.csv: column 'params' is missing"),
    Case("fit_points_a_directory", ["experiments.fit", "--points={work}/empty", "--out={work}/new_fit"],
         r"empty: is a directory"),
    Case("fit_sweep_not_a_sweep", ["experiments.fit", "--sweep={work}/empty", "--out={work}/new_fit"],
         r"empty/results\.jsonl: no such file"),
    Case("fit_out_is_a_file", FIT[:-1] + ["--out={work}/a_file"], r"--out=.*a_file: it exists and is not a directory"),
    Case("fit_out_of_no_user", FIT[:-1] + ["--out=~no_such_user_zz/fit"], r"~no_such_user_zz is no user's home"),
    # ---- compare
    Case("compare_no_baseline", ["experiments.compare", "--variant={work}/empty", "--out={work}/new_compare"],
         r"--baseline=DIR is required"),
    Case("compare_missing_baseline", COMPARE[:1] + ["--baseline={work}/nope"] + COMPARE[2:],
         r"--baseline=.*nope: no such directory"),
    Case("compare_not_a_sweep", COMPARE, r"--baseline=.*empty is not a sweep directory"),
    Case("compare_negative_at_flops", COMPARE + ["--at_flops=-1"], r"at_flops=-1\.0 is not valid"),
    Case("compare_at_flops_not_a_number", COMPARE + ["--at_flops=abc"], r"--at_flops=abc"),
    Case("compare_negative_bootstrap", COMPARE + ["--bootstrap=-5"], r"--bootstrap=-5"),
    # ---- export, sample, attention
    Case("export_not_a_run", ["experiments.export", "--workdir={work}/empty", "--out={work}/new_export"],
         r"empty/config\.json not found: .* is not a training run directory"),
    Case("export_no_out", ["experiments.export", "--workdir={work}/empty"], r"--out"),
    Case("export_step_not_a_number", ["experiments.export", "--workdir={work}/empty", "--out={work}/new_export",
                                      "--step=abc"], r"--step=abc"),
    Case("export_positional_argument", ["experiments.export", "--workdir={work}/empty", "--out={work}/new_export",
                                        "hf_out"], r"unexpected argument.*'hf_out'"),
    Case("export_half_written_config_json", ["experiments.export", "--workdir={work}/damaged_run",
                                             "--out={work}/new_export"], r"damaged_run/config\.json"),
    Case("sample_negative_temperature", ["experiments.sample", "--workdir={work}/empty", "--temperature=-1"],
         r"temperature=-1\.0 must be >= 0"),
    Case("sample_top_p_above_1", ["experiments.sample", "--workdir={work}/empty", "--top_p=1.5"], r"top_p=1\.5"),
    Case("sample_negative_top_k", ["experiments.sample", "--workdir={work}/empty", "--top_k=-1"], r"top_k=-1"),
    Case("sample_prompt_without_flag", ["experiments.sample", "--workdir={work}/empty", "Once upon a time"],
         r"unexpected argument.*'Once upon a time'"),
    Case("sample_half_written_config_json", ["experiments.sample", "--workdir={work}/damaged_run"],
         r"damaged_run/config\.json"),
    Case("attention_layers_not_numbers", ["experiments.attention", "--workdir={work}/empty", "--text=hi",
                                          "--out={work}/new_attention", "--layers=a,b"],
         r"--layers=a,b must be comma-separated integers"),
    Case("attention_no_text", ["experiments.attention", "--workdir={work}/empty", "--out={work}/new_attention"],
         r"--text"),
    Case("attention_missing_run", ["experiments.attention", "--workdir={work}/nope", "--text=hi",
                                   "--out={work}/new_attention"], r"--workdir=.*nope does not exist"),
    # ---- prepare_data, plot_lr_scans
    Case("prepare_positional_argument", PREPARE + ["gpt2_tiny"], r"unexpected argument.*'gpt2_tiny'"),
    Case("prepare_compare_with_bytes", PREPARE + ["--compare_tokenizers"],
         r"--compare_tokenizers needs data\.tokenizer to be a Hugging Face tokenizer\.json"),
    Case("prepare_missing_tokenizer", PREPARE + ["--config.data.tokenizer={work}/nope.json"],
         r"data\.tokenizer=.*nope\.json': no such file"),
    Case("prepare_cache_dir_of_no_user", PREPARE + LOCAL + ["--config.data.cache_dir=~no_such_user_zz/c"],
         r"data\.cache_dir='~no_such_user_zz/c': ~no_such_user_zz is no user's home"),
    Case("plot_no_out", ["experiments.plot_lr_scans", "--scans={work}/empty"], r"--scans=DIR.* and --out=FILE\.png"),
    Case("plot_missing_scan", PLOT + ["--scans={work}/nope"], r"nope/lr_fit\.json does not exist"),
    Case("plot_titles_mismatch", PLOT + ["--scans={work}/empty", "--titles=a,b"], r"--titles has 2 entries for 1"),
    Case("plot_positional_argument", PLOT + ["--scans={work}/empty", "extra.png"], r"unexpected argument.*extra\.png"),
    Case("plot_damaged_lr_fit", PLOT + ["--scans={work}/damaged_scan"], r"damaged_scan/lr_fit\.json"),
]


class Environment(NamedTuple):
    id: str
    argv: list[str]
    pattern: str
    needs: str                # the directory it aims at: ro (read-only mount), full (a full tmpfs), locked (0555)
    as_nobody: bool = False   # run as an unprivileged user (root ignores permissions)
    xfail: str | None = None


ENVIRONMENT = [
    Environment("train_on_a_read_only_fs", TRAIN + SMALL + ["--workdir={work}/ro/run"],
                r"--workdir=\S*/ro/run: .*(Read-only file system|not writable)", "ro"),
    Environment("sweep_on_a_read_only_fs", SWEEP[:-2] + ["--workdir={work}/ro/sweep"],
                r"--workdir=\S*/ro/sweep: .*Read-only file system", "ro"),
    Environment("fit_on_a_read_only_fs", FIT[:-1] + ["--out={work}/ro/fit"], r"--out=.*/ro/fit: Read-only", "ro"),
    Environment("cache_on_a_read_only_fs", PREPARE + LOCAL + ["--config.data.cache_dir={work}/ro/cache"],
                r"data\.cache_dir: cannot write the token cache in .*/ro/cache.*Read-only file system", "ro"),
    Environment("train_on_a_full_disk", TRAIN + SMALL + ["--workdir={work}/full/run"],
                r"--workdir=\S*/full/run: .*/full/run/.*No space left on device", "full"),
    Environment("sweep_on_a_full_disk", SWEEP[:-2] + ["--workdir={work}/full/sweep"],
                r"--workdir=\S*/full/sweep: .*/full/sweep/sweep\.json.*No space left on device", "full"),
    Environment("fit_on_a_full_disk", FIT[:-1] + ["--out={work}/full/fit"],
                r"--out=.*/full/fit: .*/full/fit/fit\.json.*: No space left on device", "full"),
    Environment("cache_on_a_full_disk", PREPARE + LOCAL + ["--config.data.cache_dir={work}/full/cache"],
                r"data\.cache_dir=.*/full/cache: .*/full/cache/tokens/.*: No space left on device", "full"),
    Environment("train_in_a_forbidden_dir", TRAIN + SMALL + ["--workdir={work}/locked/run"],
                r"(?i)--workdir=\S*/locked/run: .*permission denied", "locked", as_nobody=True),
    Environment("sweep_in_a_forbidden_dir", SWEEP[:-2] + ["--workdir={work}/locked/sweep"],
                r"(?i)--workdir=\S*/locked/sweep: .*permission denied", "locked", as_nobody=True),
    Environment("fit_in_a_forbidden_dir", FIT[:-1] + ["--out={work}/locked/fit"],
                r"--out=.*/locked/fit: Permission denied", "locked", as_nobody=True),
    Environment("cache_in_a_forbidden_dir", PREPARE + LOCAL + ["--config.data.cache_dir={work}/locked/cache"],
                r"data\.cache_dir: cannot write the token cache in .*/locked/cache.*Permission denied", "locked",
                as_nobody=True),
]

NOBODY = 65534
DOCUMENTS = {f"doc {i}, ü.txt": f"document {i}: " + " ".join(["alpha", "béta", "γάμμα", "delta"][(i * j) % 4]
                                                          for j in range(3000)) for i in range(6)}


def _mount(args: list[str]) -> str | None:
    """None when the mount worked, else why not."""
    try:
        r = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def _fill(directory: str) -> None:
    """Writes zeros into `directory` until its file system is full."""
    with open(os.path.join(directory, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


def _prepare(work: str) -> dict[str, str]:
    """The trial's files: a file where a directory is expected, an empty directory, CSVs, a run directory with a
    half-written config.json, a damaged lr_fit.json, text files in a directory with a space and Unicode in its
    name; and the ro / full / locked directories. Returns {directory kind: why it is unavailable}."""
    for d in ("empty", "damaged_run", "damaged_scan", "dïr with space", "home", "locked"):
        os.makedirs(os.path.join(work, d))
    with open(os.path.join(work, "a_file"), "w") as f:
        f.write("a file, not a directory\n")
    with open(os.path.join(work, "points.csv"), "w") as f:
        f.write("params,tokens,loss\n1000,20000,3.0\n2000,40000,2.9\n4000,80000,2.8\n")
    with open(os.path.join(work, "text_loss.csv"), "w") as f:
        f.write("params,tokens,loss\n1000,20000,abc\n2000,40000,2.9\n")
    open(os.path.join(work, "empty.csv"), "w").close()
    with open(os.path.join(work, "damaged_run", "config.json"), "w") as f:
        f.write('{\n  "data": {\n    "cache_dir": "",\n    "data_dir": "/x",\n    "eval_fr')  # cut mid-write
    with open(os.path.join(work, "damaged_scan", "lr_fit.json"), "w") as f:
        f.write('{"coefficient": 0.1, "expo')
    for name, text in DOCUMENTS.items():
        with open(os.path.join(work, "dïr with space", name), "w") as f:
            f.write(text)
    with open(os.path.join(work, "bug.py"), "w") as f:
        f.write("def get_config(arg=None):\n    return 1 + 'x'\n")
    os.chmod(os.path.join(work, "home"), 0o777)
    os.chmod(os.path.join(work, "locked"), 0o555)
    unavailable = {}
    for kind, options in (("ro", "ro,size=1m"), ("full", "size=512k")):
        os.makedirs(os.path.join(work, kind))
        why = _mount(["-t", "tmpfs", "-o", options, "tmpfs", os.path.join(work, kind)])
        if why:
            unavailable[kind] = f"cannot mount a tmpfs here ({why})"
        elif kind == "full":
            _fill(os.path.join(work, kind))
    if os.geteuid() != 0:
        unavailable["locked"] = "needs root to run a command as another user"
    return unavailable



def _unmount(work: str) -> None:
    for kind in ("ro", "full"):
        path = os.path.join(work, kind)
        if os.path.ismount(path):
            subprocess.run(["umount", "-l", path], capture_output=True, timeout=60)


def _argv(argv: list[str], work: str, data: str) -> list[str]:
    return [a.format(work=work, data=data, repo=REPO) for a in argv]


PARITY = [("parity_config_error", DRY + ["--config.model.num_heads=5"]),
          ("parity_bug", ["experiments.train", "--config={work}/bug.py", "--workdir={work}/new_run"])]


@pytest.fixture(scope="module")
def trial(corpus_dir):
    """Every case run once against one prepared directory: {case id: result} (fault_runner.run_commands), and
    {directory kind: why unavailable}. The directory is outside pytest's 0700 tmp so `nobody` can reach it."""
    work = tempfile.mkdtemp(prefix="fault-trial-")
    os.chmod(work, 0o755)
    try:
        unavailable = _prepare(work)
        # the corpus where `nobody` can read it (pytest's and CI's temporary folders are 0700): a forbidden
        # workdir must be the error, not the corpus
        corpus_dir = shutil.copytree(corpus_dir, os.path.join(work, "tfds"))
        subprocess.run(["chmod", "-R", "a+rX", corpus_dir], check=True)
        cases, ids = [], []
        for case in MISTAKES:
            ids.append(case.id)
            cases.append({"argv": _argv(case.argv, work, corpus_dir), "watch": [work], "timeout": 120,
                          "env": case.env or {}})
        if "locked" not in unavailable:  # can `nobody` import the commands' packages here? (CI's venv is 0700)
            ids.append("nobody_probe")
            cases.append({"argv": ["experiments.train", "--help"], "timeout": 120, "uid": NOBODY,
                          "env": {"HOME": os.path.join(work, "home")}})
        for case in ENVIRONMENT:
            if case.needs in unavailable:
                continue
            ids.append(case.id)
            cases.append({"argv": _argv(case.argv, work, corpus_dir), "watch": [work], "timeout": 120,
                          "uid": NOBODY if case.as_nobody else None,
                          "env": {"HOME": os.path.join(work, "home")} if case.as_nobody else {}})
        for cid, argv in PARITY:
            ids.append(cid)
            cases.append({"argv": _argv(argv, work, corpus_dir), "timeout": 120})
        # a path with spaces, a comma and Unicode in it: a cache built there, then found again
        ids.append("unicode_cache")
        cases.append({"argv": _argv(PREPARE + LOCAL, work, corpus_dir) + [
            f"--config.data.cache_dir={work}/cäche, with space", "--config.data.eval_fraction=0.4"], "timeout": 120})
        results = dict(zip(ids, run_commands(cases, data_dir=corpus_dir, cwd=work)))  # a relative path lands here
        probe = results.get("nobody_probe")
        if probe is not None and "Traceback" in probe["stderr"]:  # (absl's --help itself exits 1)
            last = (probe["stderr"].strip().splitlines() or ["?"])[-1]
            unavailable["locked"] = f"the user nobody cannot import this project's packages here ({last[:160]})"
        yield results, unavailable, work, corpus_dir
    finally:
        _unmount(work)
        os.chmod(os.path.join(work, "locked"), 0o755)
        shutil.rmtree(work, ignore_errors=True)


def _one_error(result: dict, pattern: str) -> str:
    """Asserts exit 2, one `error:` line matching `pattern`, no traceback; returns the line."""
    text = result["stdout"] + result["stderr"]
    assert result["returncode"] == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = error_lines(result)
    assert len(errors) == 1, text[-3000:]
    assert re.search(pattern, errors[0]), errors[0]
    return errors[0]


def _marks(xfail: str | None) -> list:
    return [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c.xfail)) for c in MISTAKES])
def test_a_mistyped_command_line_is_one_error_and_writes_nothing(trial, case):
    results, _, _, _ = trial
    _one_error(results[case.id], case.pattern)
    assert results[case.id]["changed"] == [], results[case.id]["changed"]


def _mistake(argv: list[str]) -> tuple[str, frozenset[str]]:
    """What a command line gets wrong: its command and the arguments beyond the set-up every case shares."""
    shared = ("--config=", "--workdir=", "--config.data.data_dir=", "--config.base.data.data_dir=", "--dry_run",
              "--config.train.warmup_steps=1", "--out=")
    return argv[0], frozenset(a for a in argv[1:] if not a.startswith(shared) and a not in SMALL)


def test_the_mistakes_are_many_and_new():
    """50+ command lines, each its own mistake, none one of test_bad_inputs.py's."""
    from test_bad_inputs import CASES

    ours = [_mistake(c.argv) for c in MISTAKES]
    assert len(MISTAKES) >= 50 and len({c.id for c in MISTAKES}) == len(MISTAKES)
    assert len({tuple(c.argv) for c in MISTAKES}) == len(MISTAKES)
    theirs = {_mistake(args) for _, args, _ in CASES}
    assert [c.id for c, m in zip(MISTAKES, ours) if m in theirs and m[1]] == []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c.xfail)) for c in ENVIRONMENT])
def test_an_environment_error_is_one_line_naming_the_path_and_leaves_no_file(trial, case):
    """A read-only file system, a full disk, a directory the user may not write: one line naming the path and the
    cause, exit 2, no traceback; no file is left (a directory made before a full disk said so may stay)."""
    results, unavailable, _, _ = trial
    if case.needs in unavailable:
        pytest.skip(unavailable[case.needs])
    _one_error(results[case.id], case.pattern)
    assert [p for p in results[case.id]["changed"] if not p.endswith("/")] == []


def test_the_forked_runner_gives_what_python_m_gives(trial, corpus_dir):
    """tests/fault_runner.py's fork of a pre-imported interpreter and a plain `python -m` agree: a ConfigError
    after JAX is imported, and a bug in a config file (a traceback, exit 1)."""
    results, _, work, _ = trial
    plain = run_commands([{"argv": _argv(argv, work, corpus_dir), "timeout": 120} for _, argv in PARITY],
                         data_dir=corpus_dir, fork=False, cwd=work)
    for (cid, _), p in zip(PARITY, plain):
        forked = results[cid]
        assert forked["forked"] and not p["forked"]
        assert forked["returncode"] == p["returncode"], (cid, forked, p)
        assert error_lines(forked) == error_lines(p), cid
        assert ("Traceback" in forked["stderr"]) == ("Traceback" in p["stderr"]), cid
    assert results["parity_bug"]["returncode"] == 1 and "TypeError" in results["parity_bug"]["stderr"]


def test_a_cache_under_a_path_with_spaces_a_comma_and_unicode(trial):
    """data.files in "dïr with space/doc N, ü.txt", data.cache_dir "cäche, with space": built and listed."""
    results, _, work, _ = trial
    r = results["unicode_cache"]
    assert r["returncode"] == 0, r["stderr"][-3000:]
    assert f'"cache": "{work}/c\\u00e4che, with space/tokens/' in r["stdout"], r["stdout"]
    counts = [int(n) for n in re.findall(r'"documents": (\d+)', r["stdout"])]
    assert len(counts) == 2 and sum(counts) == len(DOCUMENTS) and min(counts) >= 1, r["stdout"]


def test_an_os_error_is_one_line_only_where_the_environment_is_at_fault():
    """experiments.cli.environment_error: which OSErrors are the user's environment (one line) and which may be
    bugs (None: the traceback stays)."""
    from experiments.cli import environment_error

    argv = ["prog", "--workdir=/data/runs/r1", "--config.data.cache_dir=rel/cache"]
    here = os.path.abspath("rel/cache")

    def err(code: int, filename: str | None = None) -> OSError:
        return OSError(code, os.strerror(code), filename) if filename else OSError(code, os.strerror(code))

    assert environment_error(err(errno.EROFS, "/data/runs/r1"), argv).startswith(
        "--workdir=/data/runs/r1: Read-only file system; choose a directory on a writable file system")
    assert environment_error(err(errno.ENOSPC, "/data/runs/r1/config.json"), argv).startswith(
        "--workdir=/data/runs/r1: /data/runs/r1/config.json: No space left on device; free space")
    assert environment_error(err(errno.EACCES, "/etc/elsewhere"), argv).startswith(
        "/etc/elsewhere: Permission denied")  # not a named path: still the environment's, named by its file
    assert environment_error(err(errno.EEXIST, here), argv) == (
        "--config.data.cache_dir=rel/cache: it exists and is not a directory (File exists)")
    assert environment_error(err(errno.EEXIST, "/tmp/a_lock_of_ours"), argv) is None  # a path the program chose
    assert environment_error(err(errno.ENOENT, "/data/runs/r1"), argv) is None  # missing: the program's to say
    assert environment_error(err(errno.ENOSPC), argv) is None  # no file to name: the traceback shows where
    assert environment_error(ValueError("bad"), argv) is None
    try:  # a library's wrapper raised `from` the OSError is the environment's too; one raised while handling, not
        raise RuntimeError("checkpoint save failed") from err(errno.EDQUOT, "/data/runs/r1/checkpoints/4")
    except RuntimeError as e:
        assert "Disk quota exceeded" in environment_error(e, argv)
    tensorstore = ValueError('RESOURCE_EXHAUSTED: Error writing "params.w/0.0" in OCDBT database at local file '
                             '"/data/runs/r1/checkpoints/10.orbax-checkpoint-tmp/d/": Failed writing: "/data/runs/r1/'
                             'checkpoints/10.orbax-checkpoint-tmp/d/70a7": Failed to write 124410 bytes to file 20: '
                             "No space left on device [os_error_code='28']")  # orbax's failed save on a full disk
    assert environment_error(tensorstore, argv) == (
        "--workdir=/data/runs/r1: /data/runs/r1/checkpoints/10.orbax-checkpoint-tmp/d/70a7: No space left on device; "
        "free space on that file system, or choose a directory on another one, then rerun the command")
    try:
        try:
            raise err(errno.EROFS, "/data/runs/r1")
        except OSError:
            raise KeyError("a bug while handling it")
    except KeyError as e:
        assert environment_error(e, argv) is None


def test_a_failed_write_names_its_file_from_the_frame_that_wrote_it(tmp_path):
    """A write() or a close() that fails carries no file name; the file object of the frame that raised names it."""
    from experiments.cli import environment_error

    path = str(tmp_path / "out" / "fit.json")
    os.makedirs(os.path.dirname(path))

    def write_json(target: str) -> None:
        with open(target, "w") as f:
            f.write("{}")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what f.flush() raises on a full disk

    try:
        write_json(path)
    except OSError as e:
        assert environment_error(e, ["prog", f"--out={tmp_path / 'out'}"]) == (
            f"--out={tmp_path / 'out'}: {path}: No space left on device; free space on that file system, or choose "
            f"a directory on another one, then rerun the command")

    def claim(target: str) -> None:  # os.write(fd, ...) in a function given the path
        fd = os.open(target + ".claim", os.O_CREAT | os.O_WRONLY)
        os.close(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        claim(path)
    except OSError as e:
        assert environment_error(e, ["prog"]).startswith(f"{path}: No space left on device")


def test_a_librarys_log_of_an_environment_error_is_left_to_the_one_line(monkeypatch):
    """orbax logs a failed asynchronous save from each of its threads, traceback included, before the error
    reaches the command: those records are dropped (the one error line says it); any other record is kept."""
    import logging
    import sys

    from experiments.cli import _EnvironmentErrorLogs

    monkeypatch.setattr(sys, "argv", ["prog", "--workdir=/data/runs/r1"])

    def record(exception: BaseException | None) -> logging.LogRecord:
        return logging.LogRecord("absl", logging.ERROR, "future.py", 387, "raised an exception: %s", (exception,),
                                 (type(exception), exception, None) if exception else None)

    keep = _EnvironmentErrorLogs().filter
    assert not keep(record(OSError(errno.ENOSPC, "No space left on device", "/data/runs/r1/checkpoints/10")))
    assert keep(record(ValueError("a bug in a handler")))
    assert keep(record(None))


def test_a_log_record_while_the_interpreter_shuts_down_is_kept_not_a_traceback(monkeypatch):
    """asyncio may log a checkpoint's failed callbacks while the interpreter shuts down, when sys.argv is None: the
    filter kept the records then by raising TypeError in the logging call, each a traceback of its own (seen on a
    disk that filled at a checkpoint, 2026-11-28); it keeps them quietly."""
    import logging
    import sys

    from experiments.cli import _EnvironmentErrorLogs

    monkeypatch.setattr(sys, "argv", None)
    error = OSError(errno.ENOSPC, "No space left on device", "/data/runs/r1/checkpoints/10")
    assert _EnvironmentErrorLogs().filter(logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1804,
                                                            "Exception in callback", (), (OSError, error, None)))

"""transformer/spec: the checked run spec (one ConfigError naming the setting per mistake, from the constructors),
the one learning-rate arithmetic in numpy and jax.numpy alike, config.json read back, and the sweep design and
the fit running where JAX cannot be imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import lm
from test_fits import isoflop_grid, write_csv
from transformer.spec import (ConfigError, DataSpec, MeshSpec, ModelConfig, RunSpec, TrainSpec, lr_at, model_spec,
                              padded_vocab_size)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- TrainSpec

@pytest.mark.parametrize("changes, message", [
    (dict(steps=0), r"train\.steps=0 must be a positive integer"),
    (dict(keep_checkpoints=0), r"train\.keep_checkpoints=0 must be a positive integer"),
    (dict(eval_every=-1), r"train\.eval_every=-1 must be a positive integer"),
    (dict(learning_rate=0.0), r"train\.learning_rate=0\.0 must be positive"),
    (dict(learning_rate=float("inf")), r"train\.learning_rate=inf must be positive and finite"),
    (dict(learning_rate=float("nan")), r"train\.learning_rate=nan must be positive and finite"),
    (dict(learning_rate="3e-4"), r"train\.learning_rate='3e-4' must be positive and finite"),
    (dict(b1=-0.1), r"train\.b1=-0\.1 must be in \[0, 1\) \(Adam's first-moment decay\)"),
    (dict(b2=1.5), r"train\.b2=1\.5 must be in \[0, 1\)"),
    (dict(b2=1.0), r"train\.b2=1\.0 must be in \[0, 1\)"),
    (dict(eps=0.0), r"train\.eps=0\.0 must be positive and finite"),
    (dict(weight_decay=-0.1), r"train\.weight_decay=-0\.1 must be >= 0 and finite"),
    (dict(grad_clip=float("inf")), r"train\.grad_clip=inf must be >= 0 and finite"),
    (dict(decay_fraction=1.5), r"train\.decay_fraction=1\.5 must be in \(0, 1\]"),
    (dict(max_skipped_fraction=-0.5), r"train\.max_skipped_fraction=-0\.5 must be in \[0, 1\]"),
    (dict(seed=-1), r"train\.seed=-1 must be an integer >= 0"),
    (dict(loss_chunk_size=-8), r"train\.loss_chunk_size=-8 must be an integer >= 0 \(0: off\)"),
    (dict(warmup_steps=-2), r"train\.warmup_steps=-2 must be an integer between 0 and train\.steps, or -1"),
    (dict(init_from=3), r"train\.init_from=3 must be a string"),
    (dict(schedule="cos"), r"train\.schedule='cos' is not valid; choose one of cosine, linear, constant, wsd"),
    (dict(warmup_steps=2000), r"train\.warmup_steps=2000 must be between 0 and train\.steps=1000"),
    (dict(final_lr_fraction=1.5), r"train\.final_lr_fraction=1\.5 must be in \[0, 1\]"),
    (dict(nonfinite="ignore"), r"train\.nonfinite='ignore' is not valid; choose one of stop, skip"),
    (dict(grad_clip=-1.0), r"train\.grad_clip=-1\.0 must be >= 0"),
    (dict(compute_dtype="float16"), r"train\.compute_dtype='float16' is not valid; choose one of float32, bfloat16"),
    (dict(schedule="wsd", decay_fraction=0.0), r"train\.decay_fraction=0\.0 must be in \(0, 1\]"),
    (dict(schedule="wsd", warmup_steps=900), r"the warm-up \(900 steps\) overlaps the decay, which starts at step 800"),
])
def test_train_spec_refuses_a_bad_setting_by_name(changes, message):
    train = {**lm.get_config("gpt2_tiny").train.to_dict(), **changes}  # a plain dict: any type (sweep.json's)
    with pytest.raises(ConfigError, match=message):
        TrainSpec.from_config(train)


def test_train_spec_accepts_the_edges_of_each_range():
    spec = TrainSpec(b1=0.0, b2=0.0, weight_decay=0, grad_clip=0.0, final_lr_fraction=1.0, decay_fraction=1.0,
                     max_skipped_fraction=0.0, eps=1e-30, learning_rate=1000, seed=0)
    assert spec.b2 == 0.0 and spec.learning_rate == 1000


def test_train_spec_takes_the_config_files_train_block_whole():
    train = lm.get_config("gpt2_tiny").train
    spec = TrainSpec.from_config(train)
    assert {k: v for k, v in spec.to_dict().items() if k in train} == {k: train[k] for k in spec.to_dict() if k in train}
    assert spec.warmup == 100 and spec.decay_start is None  # the default warm-up of a 1000-step run


# ---------------------------------------------------------------- the schedule

@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd"])
def test_the_learning_rate_is_one_computation_in_numpy_and_in_jax(schedule):
    spec = TrainSpec(steps=40, warmup_steps=6, learning_rate=3e-3, schedule=schedule, final_lr_fraction=0.1,
                     decay_fraction=0.25)
    counts = np.arange(45)
    host = spec.lr_at(counts)
    device = np.asarray(spec.lr_at(jnp.asarray(counts), xp=jnp))
    np.testing.assert_allclose(host, device, rtol=1e-6)
    assert host.dtype == np.float32 and np.all(host > 0)  # no step at rate 0, the first included
    assert host[0] == pytest.approx(3e-3 / 6) and host[5] == pytest.approx(3e-3)  # warm-up reaches the peak at step 6
    assert float(spec.lr_at(7)) == pytest.approx(host[7])  # a scalar count too


def test_the_cosine_ends_at_its_final_fraction_and_wsd_cools_down_from_its_decay_start():
    """At trained counts: count c is step c + 1, and the last step (count steps − 1) trains at the final fraction."""
    cosine = TrainSpec(steps=100, warmup_steps=10, learning_rate=1.0, final_lr_fraction=0.1)
    assert float(cosine.lr_at(99)) == pytest.approx(0.1) and float(cosine.lr_at(54)) == pytest.approx(0.55)
    assert float(cosine.lr_at(9)) == pytest.approx(1.0) and float(cosine.lr_at(10)) < 1.0  # the peak once, at step 10
    wsd = TrainSpec(steps=100, warmup_steps=10, learning_rate=2.0, schedule="wsd", final_lr_fraction=0.0,
                    decay_fraction=0.2)
    assert wsd.decay_start == 80 and float(wsd.lr_at(79)) == pytest.approx(2.0)  # step 80: the last stable step
    assert float(wsd.lr_at(84)) == pytest.approx(1.0) and float(wsd.lr_at(99)) == pytest.approx(0.0, abs=1e-7)
    assert float(lr_at(0, peak=1.0, steps=10, warmup=0, schedule="constant", final_lr_fraction=0.0)) == 1.0


# ---------------------------------------------------------------- MeshSpec

def _mesh(data=-1, fsdp=1, tensor=1, rules=None) -> dict:
    return dict(data=data, fsdp=fsdp, tensor=tensor, rules=rules if rules is not None else lm.get_config().mesh.rules)


def test_mesh_spec_resolves_the_free_axis_and_refuses_a_shape_that_does_not_fit():
    assert MeshSpec.from_config(_mesh(fsdp=2), 8).shape == (4, 2, 1)
    with pytest.raises(ConfigError, match=r"mesh \{'data': 3, 'fsdp': 1, 'tensor': 1\} has 3 devices but 4"):
        MeshSpec.from_config(_mesh(data=3), 4)
    with pytest.raises(ConfigError, match="at most one axis may be -1"):
        MeshSpec.from_config(_mesh(fsdp=-1), 4)
    with pytest.raises(ConfigError, match=r"mesh\.tensor=0 is not valid"):
        MeshSpec.from_config(_mesh(tensor=0), 4)
    with pytest.raises(ConfigError, match=r"mesh\.rules maps 'heads' to 'model', which is not a mesh axis"):
        MeshSpec.from_config(_mesh(rules=[("heads", "model")]), 4)


def test_mesh_spec_checks_the_batch_and_each_model_dimension_under_its_own_rule():
    mesh = MeshSpec.from_config(_mesh(data=2, tensor=4), 8)
    assert mesh.ways("batch") == 2 and mesh.ways("heads") == 4 and mesh.ways("seq") == 1
    with pytest.raises(ConfigError, match=r"train\.batch_size=6 must be divisible by the number of processes \(4\)"):
        mesh.check_batch(6, 4)
    with pytest.raises(ConfigError, match=r"train\.batch_size=5 must be divisible by the data-parallel size 2"):
        mesh.check_batch(5, 1)
    with pytest.raises(ConfigError, match=r"model\.num_heads=6 must be divisible by 4, the size of mesh axes"):
        mesh.check_model(ModelConfig(d_model=96, num_heads=6))
    with pytest.raises(ConfigError, match=r"model\.d_ff=1026 must be divisible by 4"):
        mesh.check_model(ModelConfig(d_ff=1026))


# ---------------------------------------------------------------- RunSpec and config.json

def test_run_spec_refuses_a_sequence_longer_than_the_position_table():
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len = c.model.max_len * 2
    with pytest.raises(ConfigError, match=r"data\.seq_len=\d+ exceeds model\.max_len"):
        RunSpec.from_dict(c.to_dict() | {"model": {**c.model.to_dict(), "vocab_size": 384}})


@pytest.mark.parametrize("family, task, message", [
    ("encoder", "lm", r"train\.task='lm' does not fit model\.family='encoder' \(it is a task of "
                      r"model\.family='decoder'\); "
                      r"valid for encoder: mlm, classify \(\"\" = mlm\)"),
    ("decoder", "mlm", r"train\.task='mlm' does not fit model\.family='decoder' .*valid for decoder: lm"),
    ("decoder", "span_corruption", r"train\.task='span_corruption' does not fit model\.family='decoder'"),
    ("encoder_decoder", "lm", r"valid for encoder_decoder: span_corruption"),
    ("decoder", "translate", r"train\.task='translate' does not fit model\.family='decoder'; valid for decoder: lm"),
])
def test_a_task_its_family_does_not_support_is_refused_naming_both(family, task, message):
    with pytest.raises(ConfigError, match=message):
        RunSpec(model=ModelConfig(family=family), train=TrainSpec(task=task), mesh=MeshSpec.from_config(_mesh(), 1),
                seq_len=64)


def test_each_family_trains_its_own_tasks_and_defaults_to_the_first():
    from transformer.spec import FAMILIES, FAMILY_TASKS, run_task
    from transformer.tasks import TASKS, get_task
    assert set(FAMILY_TASKS) == set(FAMILIES) and set(TASKS) == {t for v in FAMILY_TASKS.values() for t in v}
    assert [run_task(f, "") for f in FAMILIES] == ["lm", "mlm", "span_corruption"]
    spec = RunSpec(model=ModelConfig(family="encoder", num_classes=0), train=TrainSpec(task="classify"),
                   mesh=MeshSpec.from_config(_mesh(), 1), seq_len=64)
    assert get_task(spec).name == "classify"


@pytest.mark.parametrize("chunk, task, family, message", [
    (7, "", "decoder", r"train\.loss_chunk_size=7 must divide data\.seq_len=64; valid: 0 \(off\), 1, 2, 4, 8, 16"),
    (16, "", "encoder", r"train\.loss_chunk_size=16 is for task lm only \(this run's task is mlm\); set it to 0$"),
])
def test_a_loss_chunk_size_is_checked_against_the_sequence_and_the_task(chunk, task, family, message):
    with pytest.raises(ConfigError, match=message):
        RunSpec(model=ModelConfig(family=family), train=TrainSpec(loss_chunk_size=chunk, task=task),
                mesh=MeshSpec.from_config(_mesh(), 1), seq_len=64)
    assert RunSpec(model=ModelConfig(), train=TrainSpec(loss_chunk_size=16), mesh=MeshSpec.from_config(_mesh(), 1),
                   seq_len=64).train.loss_chunk_size == 16


def test_a_run_spec_reads_back_from_the_config_json_it_writes(tmp_path):
    c = lm.get_config("gpt2_tiny")
    model = model_spec(c, 259)
    assert model.vocab_size == padded_vocab_size(259) == 384  # the byte tokenizer's 259 ids, padded
    config = c.to_dict()
    config["model"]["vocab_size"] = model.vocab_size
    spec = RunSpec(model=model, train=TrainSpec.from_config(c.train), mesh=MeshSpec.from_config(c.mesh, 1),
                   seq_len=c.data.seq_len, config=json.loads(json.dumps(config)))
    spec.to_json(str(tmp_path / "config.json"))
    again = RunSpec.from_json(str(tmp_path))
    assert again == spec and again.config == spec.config
    with pytest.raises(ConfigError, match=r"model\.vocab_size=200 is smaller than the tokenizer's vocabulary \(259\)"):
        model_spec(ConfigDict({**c.to_dict(), "model": {**c.model.to_dict(), "vocab_size": 200}}), 259)


# ---------------------------------------------------------------- DataSpec

def test_a_data_spec_reads_like_the_config_data_block_it_came_from():
    c = lm.get_config("gpt2_tiny")
    data = DataSpec.of(c.data)
    assert data.to_dict() == c.data.to_dict()  # the same keys and values, so data functions read either alike
    assert (data.seq_len, data.get("eval_files", "x"), data["tfds_name"]) == (c.data.seq_len, "", "stdlib_py")
    assert data.get("classes", ("a",)) == ("a",) and "classes" not in data  # unset optional settings
    c.data.classes, c.data.my_note = ("json", "os"), "kept"
    data = DataSpec.of(c.data)
    assert data.classes == ("json", "os") and data.my_note == "kept" and data.to_dict()["my_note"] == "kept"
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        data.nope


@pytest.mark.parametrize("changes, message", [
    (dict(seq_len=0), r"data\.seq_len=0 must be a positive integer"),
    (dict(worker_count=-1), r"data\.worker_count=-1 must be >= 0"),
    (dict(eval_split="train"), r"data\.eval_split='train' is data\.train_split: evaluation would be on the training"),
    (dict(files="/x/*.txt", eval_fraction=0.0), r"data\.eval_fraction=0\.0 must be in \(0, 1\) when data\.eval_files"),
])
def test_a_data_spec_refuses_each_bad_data_setting(changes, message):
    c = lm.get_config("gpt2_tiny")
    c.data.update(changes)
    with pytest.raises(ConfigError, match=message):
        DataSpec.of(c.data)


def test_the_run_spec_carries_the_data_spec_read_back_from_config_json(tmp_path):
    c = lm.get_config("gpt2_tiny")
    config = c.to_dict()
    config["model"]["vocab_size"] = 384
    config["data"]["identity"] = {"source": "s", "tokenizer": "t", "cache_key": "k", "files": []}
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    spec = RunSpec.from_json(str(tmp_path))
    assert spec.data.seq_len == spec.seq_len == c.data.seq_len
    assert spec.data.identity == config["data"]["identity"] and spec.data.tfds_name == c.data.tfds_name
    # an eval split equal to the train split is refused when config.json is read back, as when it was resolved
    config["data"]["eval_split"] = config["data"]["train_split"]
    with pytest.raises(ConfigError, match=r"data\.eval_split='train' is data\.train_split"):
        RunSpec.from_dict(config)


# ---------------------------------------------------------------- no ConfigDict below the resolve step

# ---------------------------------------------------------------- no JAX below the training layer

BLOCKER = """import sys
class _NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _NoJax())
"""


def _without_jax(tmp_path, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), REPO])}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_blocker_blocks(tmp_path):
    r = _without_jax(tmp_path, "-c", "import jax")
    assert r.returncode != 0 and "blocked in this test" in r.stderr


def test_spec_scaling_and_the_sweep_design_import_without_jax(tmp_path):
    code = ("import importlib, pkgutil, transformer.spec, transformer.scaling\n"
            "names = [m.name for p in (transformer.spec, transformer.scaling) "
            "for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.')]\n"
            "names += ['transformer.design.' + m for m in ('spec', 'defaults', 'grid', 'budgets', 'lr_stages', 'plan')]\n"
            "for n in names: importlib.import_module(n)\n"
            "print(len(names))")
    r = _without_jax(tmp_path, "-c", code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 15


def test_fit_runs_where_jax_cannot_be_imported(tmp_path):
    n, d, c, loss = isoflop_grid()
    write_csv(str(tmp_path / "points.csv"), ["params", "tokens", "flops", "loss"], zip(n, d, c, loss))
    r = _without_jax(tmp_path, "-m", "experiments.fit", f"--points={tmp_path}/points.csv", f"--out={tmp_path}/fit",
                     "--bootstrap=0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "fit" / "fit.json").exists()


def test_a_sweep_dry_run_works_where_jax_cannot_be_imported(tmp_path):
    r = _without_jax(tmp_path, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py",
                     f"--workdir={tmp_path}/sweep", "--dry_run")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "runs would train" in r.stdout and not (tmp_path / "sweep").exists()

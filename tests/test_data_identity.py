"""A run's data identity (documents + tokenizer = the token cache's key) is recorded in config.json and its
checkpoints; resuming with other documents or another tokenizer is refused naming what changed, and the
pipeline uses the run's one tokenizer (issue 19, hole 3)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from test_data_files import _texts, data_config, train_sp_model, write_mixed_folder

from configs.lm import get_config
from transformer.data import tokenizers
from transformer.spec import ConfigError
from transformer.training.loop import train
from transformer.training.resolve import resolve
from transformer.training.run_io import check_workdir_config


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run on local files with a SentencePiece file as tokenizer, checkpointed at step 1 of 2."""
    root = tmp_path_factory.mktemp("identity")
    folder = str(root / "docs")
    write_mixed_folder(folder, _texts(60))
    model = str(root / "sp.model")
    train_sp_model(model, _texts(200, seed=2))
    config = get_config("gpt2_tiny")
    config.data = data_config(root, folder, tokenizer=model)
    config.train.update(steps=2, warmup_steps=1, batch_size=8, eval_every=2, eval_steps=1, checkpoint_every=1,
                        log_every=1)
    workdir = str(root / "run")
    assert train(config, workdir, verbose=False, stop_at=1)["status"] == "preempted"
    return config, workdir, folder, model


def test_the_identity_is_recorded_in_config_json_and_the_checkpoint(stopped_run):
    from transformer.data import identity

    config, workdir, folder, model = stopped_run
    with open(os.path.join(workdir, "config.json")) as f:
        recorded = json.load(f)["data"]["identity"]
    with open(os.path.join(workdir, "checkpoints", "1", "config", "metadata")) as f:
        assert json.load(f)["data"]["identity"] == recorded
    assert recorded["tokenizer"] == tokenizers.load_tokenizer_file(model).fingerprint
    assert sorted(path for _, path, _ in recorded["files"]) == sorted(
        os.path.join(folder, n) for n in os.listdir(folder))
    assert os.path.basename(identity.resolve_data(config.data).ensure_cache(verbose=False)) == recorded["cache_key"]


def test_resuming_with_an_added_file_is_refused_naming_it(stopped_run):
    config, workdir, folder, _ = stopped_run
    added = os.path.join(folder, "e_new.txt")
    with open(added, "w") as f:
        f.write("a document that was not there when the run started")
    try:
        with pytest.raises(ConfigError, match=rf"other data .*data.files: added {added}"):
            train(config, workdir, verbose=False)
    finally:
        os.remove(added)


def test_resuming_with_a_changed_file_is_refused_naming_it(stopped_run):
    config, workdir, folder, _ = stopped_run
    path = os.path.join(folder, "d000.txt")
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text + " and a new ending")
    try:
        with pytest.raises(ConfigError, match=rf"data.files: changed {path}"):
            train(config, workdir, verbose=False)
    finally:
        with open(path, "w") as f:
            f.write(text)


def test_resuming_with_another_tokenizer_in_the_file_is_refused(stopped_run, tmp_path):
    config, workdir, _, model = stopped_run
    saved = str(tmp_path / "saved.model")
    shutil.copy(model, saved)
    train_sp_model(model, _texts(300, seed=5))  # the same path, another model
    try:
        with pytest.raises(ConfigError, match=r"data.tokenizer=.* is another tokenizer"):
            train(config, workdir, verbose=False)
        # sampling and export read the run's recorded copy, whatever the file holds now
        assert tokenizers.get_tokenizer(config.data, workdir).fingerprint == tokenizers.load_tokenizer_file(
            saved).fingerprint
    finally:
        shutil.copy(saved, model)


def test_a_wsd_run_is_not_continued_on_other_data(stopped_run, tmp_path):
    config, _, folder, _ = stopped_run
    wsd = config.copy_and_resolve_references()
    wsd.train.update(schedule="wsd", decay_fraction=0.5)
    workdir = str(tmp_path / "wsd")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(resolve(wsd, 1, 1).config, f)
    longer = wsd.copy_and_resolve_references()
    longer.train.steps = 4
    assert check_workdir_config(workdir, json.loads(json.dumps(resolve(longer, 1, 1).config))) is not None
    added = os.path.join(folder, "e_more.txt")
    with open(added, "w") as f:
        f.write("more text for the longer run")
    try:
        with pytest.raises(ConfigError, match=rf"data.files: added {added}"):
            check_workdir_config(workdir, json.loads(json.dumps(resolve(longer, 1, 1).config)))
    finally:
        os.remove(added)


def test_a_moved_tokenizer_file_resumes_on_the_recorded_copy(stopped_run, tmp_path):
    """The pipeline tokenizes with the run's recorded tokenizer: the file it was started with may go."""
    config, workdir, _, model = stopped_run
    moved = str(tmp_path / "moved.model")
    shutil.move(model, moved)
    try:
        summary = train(config, workdir, verbose=False)
    finally:
        shutil.move(moved, model)
    assert summary["status"] == "ok" and summary["step"] == 2
    assert summary["eval_train_overlap_documents"] == 0  # held out by content: never both


def test_a_sweep_refuses_to_go_on_with_other_data(tmp_path):
    """sweep.json records the data identity of the sweep's runs; a new plan on other data is refused, and a
    run of the sweep (its config carries the recorded data.identity) resolves only to that data."""
    from configs.sweeps import common
    from transformer.sweeps import runner

    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(60))
    base = common.tiny_lm_base(seq_len=16, batch_size=8)
    base.data = data_config(tmp_path, folder)
    c = common.make(dict(name="identity", budgets=(1e11,), d_models=tuple(range(8, 257, 8)), head_dim=8, num_layers=2,
                         sizes_per_budget=5, size_span=6.0, prior_tokens_per_param=100.0, min_steps=5), base)
    workdir = str(tmp_path / "sweep")
    _, doc = runner.plan_and_write(workdir, c)
    recorded = runner.load_sweep(workdir)["data_identity"]
    assert recorded["files"] and recorded == doc["data_identity"]
    run_cfg = runner.run_config(workdir, doc["runs"][0])
    run_cfg["data"]["identity"] = recorded  # what runner.train_run gives each run
    resolve(run_cfg, 1, 1)  # the same data: fine
    added = os.path.join(folder, "e_late.txt")
    with open(added, "w") as f:
        f.write("a file that arrived while the sweep was running")
    with pytest.raises(ConfigError, match=rf"data.identity .*data.files: added {added}"):
        resolve(run_cfg, 1, 1)
    with pytest.raises(ConfigError, match=rf"the sweep in {workdir} was trained on other data.*added {added}"):
        runner.plan_and_write(workdir, c)


def test_iterators_of_a_resolved_run_reread_neither_files_nor_tokenizer(tmp_path, monkeypatch):
    """Resolved once (identity.resolve_data), the data is not globbed, hashed or tokenizer-loaded again by the
    train, eval or masked-LM iterators (the old pipeline re-derived all three per iterator and evaluation)."""
    from transformer.data import documents, identity, mlm, pipeline

    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    cfg = data_config(tmp_path, folder)
    run_data = identity.resolve_data(cfg)
    run_data.ensure_cache(verbose=False)  # built once (reading the files); then only read

    def forbidden(*args, **kwargs):
        raise AssertionError("re-derived after resolve_data")

    for module, name in ((documents, "split_files"), (documents, "files_fingerprint"), (tokenizers, "get_tokenizer")):
        monkeypatch.setattr(module, name, forbidden)
    kw = dict(global_batch_size=4, seed=0, data=run_data)
    for it in (pipeline.make_lm_iterator(cfg, split=cfg.train_split, **kw),
               pipeline.make_lm_iterator(cfg, split=cfg.eval_split, **kw),
               mlm.make_mlm_iterator(cfg, split=cfg.train_split, **kw)):
        assert next(it)["inputs"].shape == (4, cfg.seq_len)

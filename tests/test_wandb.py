"""Weights & Biases logging (logging.wandb), offline: the rows W&B holds are metrics.jsonl's, the config
is config.json, the summary summary.json; a resumed run logs to the same W&B run without logging a
step twice; a sweep's runs are grouped by sweep and logging never changes a run's id."""
from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import sys
import time

import ml_collections
import pytest

from test_reliability import tiny_config
from transformer.spec import ConfigError
from transformer.design import grid
from transformer.sweeps import runner
from transformer.training.loop import train
from transformer.training.metrics import MetricsWriter, read_metrics
from transformer.training.resolve import resolve
from transformer.training.run_io import check_workdir_config

TIMING = ("tokens_per_second",)  # the only columns a resumed run does not reproduce


def read_wandb_file(path: str) -> list:
    """The records of an offline run's .wandb file (W&B's LevelDB-style log of its own protobuf
    Records: a 7-byte file header, 32 KiB blocks, each record chunk with a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = open(path, "rb").read(), 32768
    assert data[:4] == b":W&B", path
    records, pos, chunks = [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room for a header: the block is padded
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            break
        chunks += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # a full record, or the last chunk of one
            r = pb.Record()
            r.ParseFromString(chunks)
            records.append(r)
            chunks = b""
    return records


def _items(items) -> dict:
    """A record's {key: value} (keys come as `key` or as a one-element `nested_key`)."""
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def offline_runs(workdir: str) -> list[dict]:
    """Each invocation's offline run under DIR/wandb/, oldest first: its id, group, name, config, history
    rows (with `step`) and the last value of each summary key."""
    out = []
    for path in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
        run = {"history": [], "summary": {}}
        # W&B's service process may still be writing it (finish() with a non-zero exit code returns early)
        records, deadline = read_wandb_file(path), time.time() + 60
        while not records or records[-1].WhichOneof("record_type") != "exit":
            assert time.time() < deadline, f"{path} has no exit record"
            time.sleep(0.1)
            records = read_wandb_file(path)
        for r in records:
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run.update(id=r.run.run_id, group=r.run.run_group, name=r.run.display_name,
                           config=_items(r.run.config.update), start=r.run.start_time.ToNanoseconds())
            elif kind == "history":
                row = _items(r.history.item)
                run["history"].append({"step": row.pop("_step"),
                                       **{k: v for k, v in row.items() if not k.startswith("_")}})
            elif kind == "summary":
                run["summary"].update(_items(r.summary.update))
        out.append(run)
    # the directory names hold the start time to the second: two invocations within a second sort by random id
    return sorted(out, key=lambda run: run["start"])


@pytest.fixture
def offline(monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, whatever the config says
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)


@pytest.mark.slow
def test_offline_run_holds_the_metrics_config_and_summary_and_a_resume_reuses_it(offline, corpus_dir, tmp_path):
    """A 12-step run stopped after step 8, whose step-8 checkpoint is then lost (a kill after logging
    step 8), resumed from step 4: one W&B run, steps 6 and 8 (retrained) not sent twice."""
    workdir = str(tmp_path / "run")
    config = tiny_config(corpus_dir)
    config.logging.update(wandb=True, wandb_mode="offline", wandb_project="tests", wandb_group="g")
    assert train(config, workdir, verbose=False, stop_at=8)["status"] == "preempted"
    shutil.rmtree(os.path.join(workdir, "checkpoints", "8"))
    summary = train(config, workdir, verbose=False)
    assert summary["status"] == "ok"

    run_id = open(os.path.join(workdir, "wandb_id")).read().strip()
    runs = offline_runs(workdir)
    assert len(runs) == 2 and {r["id"] for r in runs} == {run_id}
    assert {r["group"] for r in runs} == {"g"} and {r["name"] for r in runs} == {"run"}
    with open(os.path.join(workdir, "config.json")) as f:
        resolved = json.load(f)
    assert {k: v for k, v in runs[-1]["config"].items() if k != "_wandb"} == resolved

    logged = [row for r in runs for row in r["history"]]
    rows = read_metrics(workdir)
    assert [row["step"] for row in logged] == [row["step"] for row in rows] == [2, 4, 6, 8, 10, 12]
    assert [row["step"] for row in runs[1]["history"]] == [10, 12]
    for got, want in zip(logged, rows):
        assert set(got) == set(want)
        for k in set(want) - set(TIMING):
            assert got[k] == want[k], (want["step"], k)  # steps 6, 8: the first values, retrained exactly
    final = runs[-1]["summary"]
    for k in ("status", "eval_loss", "train_loss", "params", "tokens", "flops", "step"):
        assert final[k] == summary[k], k


def test_wandb_rows_once_each_across_resumes_and_from_the_start(offline, tmp_path):
    """MetricsWriter alone, three invocations: rows 2..6 with W&B off; a resume from step 4 with W&B on
    (the W&B run starts with the kept rows 2, 4) writing 6, 8; a resume from step 6 writing 8, 10 (W&B
    already has 8: only 10 is sent). A failed run's summary says so."""
    workdir = str(tmp_path)
    config = tiny_config("/data").to_dict()

    def invocation(resume_step: int, steps: tuple, offset: float, summary: dict | None = None) -> None:
        w = MetricsWriter(workdir, resume_step=resume_step, config=config)
        for step in steps:
            w.write(step, {"train_loss": offset - step, "eval_loss": float("nan")})
        if summary is not None:
            w.set_summary(summary)
        w.close()

    invocation(0, (2, 4, 6), 10.0)
    config["logging"].update(wandb=True, wandb_mode="offline")
    invocation(4, (6, 8), 20.0)
    invocation(6, (8, 10), 30.0, {"status": "failed", "error": "boom"})
    runs = offline_runs(workdir)
    assert len({r["id"] for r in runs}) == 1
    assert [[(r["step"], r["train_loss"]) for r in run["history"]] for run in runs] == [
        [(2, 8.0), (4, 6.0), (6, 14.0), (8, 12.0)], [(10, 20.0)]]
    assert [r["train_loss"] for r in read_metrics(workdir)] == [8.0, 6.0, 14.0, 22.0, 20.0]
    assert runs[1]["summary"]["error"] == "boom" and runs[1]["summary"]["status"] == "failed"


def test_a_group_of_runs_logs_one_wandb_run_each_at_once(offline, tmp_path):
    """sweep.multirun: the loop holds one MetricsWriter per run, all open, rows interleaved."""
    config = tiny_config("/data").to_dict()
    config["logging"].update(wandb=True, wandb_mode="offline")
    writers = [MetricsWriter(str(tmp_path / f"r{r}"), config=config) for r in range(2)]
    for step in (2, 4):
        for r, w in enumerate(writers):
            w.write(step, {"train_loss": 10.0 * r + step})
    for r, w in enumerate(writers):
        w.set_summary({"status": "ok", "train_loss": 10.0 * r + 4})
        w.close()
    for r in range(2):
        (run,) = offline_runs(str(tmp_path / f"r{r}"))
        assert run["name"] == f"r{r}" and run["id"] == open(tmp_path / f"r{r}" / "wandb_id").read().strip()
        assert [(x["step"], x["train_loss"]) for x in run["history"]] == [(2, 10.0 * r + 2), (4, 10.0 * r + 4)]
        assert run["summary"]["train_loss"] == 10.0 * r + 4


def test_sweep_runs_are_grouped_by_sweep_and_logging_is_not_part_of_a_run_id(tmp_path):
    config = tiny_config("/data")
    plain = grid.run_id("d64-L2-1e11", config)
    config.logging.update(wandb=True, wandb_project="p", wandb_mode="offline", profile_start=2)
    assert grid.run_id("d64-L2-1e11", config) == plain

    run = {"run_id": "d64-L2-1e11-" + plain[-8:], "config": config.to_dict()}
    assert runner.run_config(str(tmp_path / "sweeps" / "cpu"), run)["logging"]["wandb_group"] == "cpu"
    run["config"]["logging"]["wandb_group"] = "mine"
    assert runner.run_config(str(tmp_path / "cpu"), run)["logging"]["wandb_group"] == "mine"

    # a run resumed with W&B switched on (or another group) is the same run
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(tiny_config("/data").to_dict(), f)
    check_workdir_config(workdir, json.loads(json.dumps(config.to_dict())))
    config.train.seed = 1
    with pytest.raises(ConfigError, match="train.seed"):
        check_workdir_config(workdir, json.loads(json.dumps(config.to_dict())))


def test_wandb_without_the_package_is_one_config_error_naming_the_extra(monkeypatch):
    config = tiny_config("/data")
    config.logging.wandb = True
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"logging.wandb=True needs the wandb package: pip install .*\[wandb\]"):
        resolve(config, 8, 1)
    config.logging.wandb = False
    resolve(config, 8, 1)  # off (the default): wandb is never imported


def test_bad_wandb_mode_is_a_config_error():
    pytest.importorskip("wandb")
    config = tiny_config("/data")
    config.logging.update(wandb=True, wandb_mode="cloud")
    with pytest.raises(ConfigError, match="logging.wandb_mode='cloud' is not valid; choose one of online, offline"):
        resolve(config, 8, 1)


def test_configs_without_a_logging_section_still_run():
    """sweep.json files and config.json files written before logging.* existed have no such section."""
    config = tiny_config("/data")
    del config["logging"]
    resolve(config, 8, 1)
    run = {"run_id": "x", "config": config.to_dict()}
    assert "logging" not in runner.run_config("/sweeps/cpu", run)
    assert isinstance(runner.run_config("/sweeps/cpu", run), dict)  # a plain dict: resolve reads it by item access
    resolve(runner.run_config("/sweeps/cpu", run), 8, 1)

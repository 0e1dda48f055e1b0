"""What a sweep does next, from its DIR as it is: the one planning path of the real run and of its dry run.

`next_stage(workdir, config, write=...)`:
  1. the rows the design reads (DIR/results.jsonl by the failure rule); a run of DIR/sweep.json that finished
     without its row counts as recorded (the real run records it from its run directory first: execute.recover),
     and with `retry_failed` the failed runs do not (the real run removes their rows: execute.drop_failed);
  2. the plan from them (plan.design: the stages designed so far, the validation run from DIR/fit/predictions.json
     where it exists) and its sweep document (DIR/sweep.json's content);
  3. the document checked against DIR/sweep.json (check_recorded): the same design settings, the same data, the
     runs designed so far kept; otherwise one ConfigError, before anything is written (with `write`, steps 1-3 are
     first taken without writing);
  4. with `write`, where the plan waits for the prediction (the grid is recorded), the fit of the grid writes it
     (outcome.predict) and the validation run is designed from it (back to 2); without `write` the plan stays
     waiting for it (the fit is the real run's first step then; the dry run says so);
  5. `todo`: the runs of the document without a row, what trains now.
With `write` (the real run: runner.run_sweep, the SLURM step) it records the recovered rows, removes the claims of
recorded runs and writes DIR/sweep.json and the prediction; without (the dry run) it writes nothing. So the dry
run's "would train now" is the real run's todo by construction.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from transformer import files
from transformer.design import grid
from transformer.design.spec import SweepSpec, design_changes
from transformer.spec import ConfigError
from transformer.sweeps import claims, execute


@dataclasses.dataclass
class NextStage:
    """plan: plan.design's Plan from `rows`; doc: its sweep document (with data_identity); rows: {run_id: row} the
    design read; todo: the runs of doc without a row, in training order (what trains now); recovered: the runs
    recorded from their run directories (without `write`: that the real run records first); retried: the failed
    runs whose rows are (would be) removed; prediction: the prediction this call wrote (outcome.predict), None
    where none was needed, one was written before, or nothing is written."""

    plan: Any
    doc: dict[str, Any]
    rows: dict[str, dict[str, Any]]
    todo: list[dict[str, Any]]
    recovered: list[str]
    retried: list[str]
    prediction: dict[str, Any] | None = None


def sweep_document(config: Any, p: Any) -> dict[str, Any]:
    """What DIR/sweep.json holds: the resolved sweep section (p.spec, the budgets it chose filled in; else
    `config`'s) and base, the plan's notes and what it waits for, and every run designed so far (plan.design)
    with its time estimate."""
    from transformer.design.plan import estimate_seconds

    s = p.spec if p.spec is not None else SweepSpec.of(config)
    estimates = [estimate_seconds(r, s) for r in p.runs]
    return {"name": s.name, "mode": s.mode, "sweep": s.settings(), "base": json.loads(json.dumps(s.base)),
            "notes": list(p.notes), "waiting": p.waiting, "lr_fit": p.lr_fit,
            "estimated_seconds": float(sum(estimates)),
            "runs": [{**r.describe(), "estimated_seconds": e, "config": json.loads(json.dumps(r.config))}
                     for r, e in zip(p.runs, estimates)]}


def check_recorded(workdir: str, doc: dict[str, Any]) -> bool:
    """Whether `doc` may be DIR's sweep, and whether DIR/sweep.json would be written for it. A DIR holding a sweep
    designed with other settings (spec.design_changes: every sweep.* key but spec.RERUN_SETTINGS), other data, or
    runs `doc` does not keep is one ConfigError. Nothing is written when the file already says the same but for its notes (a
    finished sweep reruns in a read-only DIR, under any --parallel), nor when `doc` is a waiting plan whose runs begin the recorded ones (a result a
    later stage was designed from went missing: its run trains again, and the next design must give the recorded
    runs). Fills doc's data_identity from the recorded one where it cannot be computed yet."""
    path = os.path.join(workdir, "sweep.json")
    if not os.path.exists(path):  # a new sweep: refused here where most of its runs would measure embeddings
        grid.embedding_dominated(doc["runs"], SweepSpec.of(doc), new=True)
        return True
    old_doc = execute.load_sweep(workdir)
    changed = design_changes(old_doc.get("sweep", {}), doc["sweep"])
    if changed:
        raise ConfigError(f"--workdir={workdir} holds a sweep designed with other settings: {'; '.join(changed)}; "
                          f"its runs were designed with the recorded ones ({path}); use a new --workdir for "
                          f"another design, or the recorded settings to go on")
    if old_doc.get("data_identity"):  # the data its runs trained on: other data is refused, naming the change
        from transformer.data import identity
        identity.check_same(f"the sweep in {workdir}", old_doc["data_identity"], doc.get("data_identity"))
        doc["data_identity"] = doc.get("data_identity") or old_doc["data_identity"]
    old_ids = [r["run_id"] for r in old_doc["runs"]]
    new_ids = [r["run_id"] for r in doc["runs"]]
    if doc.get("waiting") and len(new_ids) < len(old_ids) and old_ids[:len(new_ids)] == new_ids:
        return False
    if new_ids[:len(old_ids)] != old_ids and set(new_ids) != set(old_ids):
        differ = sorted(set(old_ids) ^ set(new_ids)) or [i for i, j in zip(old_ids, new_ids) if i != j]
        raise ConfigError(f"--workdir={workdir} holds a different sweep ({len(differ)} runs differ, "
                          f"e.g. {differ[0]}); use a new --workdir, or the same settings to resume")
    # the notes are left out: what they add to the design (runs, settings, waiting) is how this invocation trains
    # (the estimate line: --parallel, the GPUs it sees), which a rerun may change without changing the sweep
    designed = lambda d: {k: v for k, v in d.items() if k != "notes"}
    return designed(json.loads(json.dumps(doc))) != designed(old_doc)


def write_sweep(workdir: str, doc: dict[str, Any]) -> None:
    """Writes DIR/sweep.json where check_recorded says so. Its runs only grow (stage by stage, in order, so a
    worker's --run_index stays valid). A DIR that cannot be written is one ConfigError."""
    if not check_recorded(workdir, doc):
        return
    path = os.path.join(workdir, "sweep.json")
    try:
        os.makedirs(os.path.join(workdir, "runs"), exist_ok=True)
        files.write_json(path, doc, indent=1)
    except OSError as e:
        raise ConfigError(f"--workdir={workdir}: cannot write {path} ({e.strerror or e}); use a directory this "
                          "process can write") from e


def design_rows(workdir: str, config: Any = None, *, write: bool = True, retry_failed: bool = False
                ) -> tuple[dict[str, dict[str, Any]], list[str], list[str]]:
    """({run_id: row} the design reads, the runs recorded from their run directories, the failed runs retried);
    module docstring, step 1. With `write`: the lost rows are recorded (execute.recover), the failed rows removed
    (retry_failed) and the claims that recorded runs left behind removed (claims.release_recorded)."""
    if write:
        retried = execute.drop_failed(workdir) if retry_failed else []
        recovered = execute.recover(workdir)
        for run_id in recovered:
            print(f"recorded {run_id} from its run directory (its results row was missing)", flush=True)
        rows = {r["run_id"]: r for r in execute.read_rows(workdir)}
        stale = SweepSpec.of(config).claim_timeout_s if config is not None else 600.0
        claims.release_recorded(workdir, rows, stale)
        return rows, recovered, retried
    rows = {r["run_id"]: r for r in execute.read_rows(workdir)} if os.path.isdir(workdir) else {}
    retried = [rid for rid, r in rows.items() if r["status"] == execute.FAILED] if retry_failed else []
    rows = {rid: r for rid, r in rows.items() if rid not in retried}
    extra = execute.recoverable(workdir, recorded=rows) if os.path.isdir(workdir) else []  # as after drop_failed
    rows.update({r["run_id"]: r for r in extra})
    return rows, [r["run_id"] for r in extra], retried


def next_stage(workdir: str, config: Any, *, write: bool, retry_failed: bool = False,
               predict: bool = True, schedule: Any = None) -> NextStage:
    """What the sweep does next (module docstring); `config`: a sweep config (ConfigDict or mapping) or its
    SweepSpec; `predict=False` stops at a plan that waits for the prediction; `schedule`: how its runs will train,
    which sweep.max_hours bounds (design/estimate.Schedule: runner.schedule; default one after another in one
    process). ConfigError where DIR holds another sweep."""
    from transformer.data import identity
    from transformer.design import plan
    from transformer.spec import DataSpec
    from transformer.sweeps import outcome

    spec = SweepSpec.of(config)
    schedule = schedule or plan.ONE_PROCESS
    data_identity = identity.peek(DataSpec.of(spec.base["data"]))  # None until the data is built
    prediction = outcome.load_prediction(workdir) if os.path.isdir(workdir) else None
    if write:  # a DIR that holds another sweep is refused before anything is written (the rows' repair included)
        ahead = design_rows(workdir, spec, write=False, retry_failed=retry_failed)[0]
        check_recorded(workdir, {**sweep_document(spec, plan.design(spec, ahead, prediction, schedule=schedule)),
                                 "data_identity": data_identity})
    rows, recovered, retried = design_rows(workdir, spec, write=write, retry_failed=retry_failed)
    made = None
    while True:
        p = plan.design(spec, rows, prediction, schedule=schedule)
        doc = {**sweep_document(spec, p), "data_identity": data_identity}
        if write:
            write_sweep(workdir, doc)
        else:
            check_recorded(workdir, doc)
        if p.waiting != "prediction" or not (write and predict):
            break
        prediction = made = outcome.predict(workdir, doc)
    todo = [r for r in doc["runs"] if r["run_id"] not in rows]
    return NextStage(p, doc, rows, todo, recovered, retried, made)


def plan_and_write(workdir: str, config: Any) -> tuple[Any, dict[str, Any]]:
    """(plan, sweep document) of next_stage with `write`, stopping at a plan that waits for the prediction (the
    stage loop of the tests' simulations predicts itself)."""
    ns = next_stage(workdir, config, write=True, predict=False)
    return ns.plan, ns.doc


def later_runs(preview: Any, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of `preview` (plan.design(preview=True): every stage from the priors) in the stages `doc` has not
    designed yet, as sweep documents list runs: the priors' guess at what is to come."""
    from transformer.design.plan import estimate_seconds

    designed = {r["stage"] for r in doc["runs"]}
    return [{**r.describe(), "estimated_seconds": estimate_seconds(r, preview.spec),
             "config": json.loads(json.dumps(r.config))} for r in preview.runs if r.stage not in designed]

"""The loop's set-up, built once before the first step: the runs resolved and their workdirs checked, the model,
optimizer, mesh and abstract state (`Setup`), each run's data iterator, checkpointer and outcome (`Runs`), and
the state restored from the newest checkpoints or freshly initialised.

Legend: R runs, p a position on the state's run axis, r a run's index in `configs`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from transformer.spec import LR_ARITHMETIC, ConfigError, DataSpec, RunSpec, flops_per_token, param_counts
from transformer.data import eval_sets, get_tokenizer, identity, record_tokenizer
from transformer.data.batches import process_rows
from transformer.data.span_corruption import span_corruption_lengths
from transformer.layers import lora
from transformer.models import build_model
from transformer.tasks import model_vocab_size
from transformer.training import checkpointing, multirun, optimizer, run_claim, scoring, sharding
from transformer.training.optimizer import make_schedule
from transformer.training.resolve import check_plain, keep_recorded_warmup, resolve
from transformer.training.run_io import check_workdir_config, check_workdir_writable, read_run_json, write_json
from transformer.training.state import abstract_state, fresh_state, model_optimizer
from transformer.training.steps import global_batch
from transformer.training.warm_start import Source, check_source, warm_start


@dataclasses.dataclass
class Runs:
    """The R runs' own things (configs as given, their resolved specs, workdirs, data iterators, checkpointers,
    writers) and outcomes. `live[p]` is the run at position p of the state's run axis; a failed run leaves it."""
    configs: list
    specs: list[RunSpec]
    workdirs: list[str]
    resolved: list[dict]
    data_args: list[dict]
    data_its: list
    ckpts: list
    grouped: bool
    primary: bool
    claims: run_claim.RunClaims | None = None  # the workdirs' claims (run_claim.py), released when the runs end
    init_sources: list = dataclasses.field(default_factory=list)  # train.init_from checked (warm_start.Source)
    writers: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        R = len(self.configs)
        self.init_sources = self.init_sources or [None] * R
        self.live = list(range(R))
        self.status, self.errors = ["ok"] * R, [None] * R
        self.skipped: list = [None] * R
        self.last: list[dict] = [{} for _ in range(R)]  # each run's last logged values (metric_keys.keeps_last)
        self.schedules = [make_schedule(s.train) for s in self.specs]

    def part(self, tree: Any, p: int) -> Any:
        """Run p's slice of a tree of arrays (a group's), or the tree itself (a run alone)."""
        return multirun.unstack(tree, p) if self.grouped else tree

    def pick(self, values: Any, p: int) -> Any:
        """Run p's entry of a group's list (evaluate's, skipped_updates'), or the value itself."""
        return values[p] if self.grouped else values

    def save(self, step: int, state: Any) -> None:
        for p, r in enumerate(self.live):
            if self.status[r] == "ok":
                self.ckpts[r].save(step, self.part(state, p), self.data_its[r], self.resolved[r], force=True)

    def next_batch(self, batch_s: Any, train_batch_s: Any) -> dict:
        if not self.grouped:  # host work overlaps the previous step
            return global_batch(next(self.data_its[0]), batch_s, self.specs[0].train.batch_size)
        rows = [next(self.data_its[r]) for r in self.live]
        return global_batch({k: np.stack([b[k] for b in rows]) for k in rows[0]}, train_batch_s)

    def describe_batch(self, r: int, step: int) -> str:
        s = self.specs[r]
        return (f"number {step - 1} of split {s.data.train_split!r} shuffled with data.shuffle_seed="
                f"{s.data.shuffle_seed}, train.seed={s.train.seed}")


@dataclasses.dataclass
class Setup:
    """What every step needs, built once: the model and its steps, the mesh, the accounting. `spec`: run 0's
    resolved RunSpec (a group's runs share all but train.learning_rate and train.seed); `config`: its config
    as given, read only for the logging.* settings (the profiler)."""
    spec: RunSpec
    config: Any
    task: Any
    model: Any
    model_cfg: Any
    tx: Any
    mesh: Any
    rules: Any
    mesh_shape: Any
    devices: list
    abstract: Any
    shardings: Any
    counts: dict
    fpt: float
    tokens_per_step: int
    token_bytes_V: Any
    train_split_tokens: int | None
    split_tokens_per_step: int  # for `epochs`: see split_tokens_per_step()
    decay_start: int | None
    data: Any  # the run's resolved data (data.identity.RunData): tokenizer, fingerprints, cache; None: not packed
    rows: Any  # this process's rows of a global batch (data.batches.process_rows)
    vocab_size_unpadded: int  # the ids a token can have, before padding (summary.json)
    eval_train_overlap_documents: int | None  # eval documents that are also train documents (packed text)
    eval_sets: list = dataclasses.field(default_factory=list)  # data.eval_sets opened (data.eval_sets.EvalSet)
    eval_tasks: list = dataclasses.field(default_factory=list)  # train.eval_tasks prepared (scoring.PreparedTask)

    def fresh_state(self, spec: RunSpec, source: Source | None = None, announce: bool = False) -> Any:
        """Step 0: initialised from the run's seed with its peak learning rate, warm-started when asked (from
        `source`, train.init_from checked by prepare; None: checked here)."""
        state = fresh_state(self.model, self.tx, spec.train, self.task.init_inputs(spec), self.mesh, self.rules)
        if spec.train.init_from:
            state, copied = warm_start(state, source or spec.train.init_from)
            if announce:
                print(f"warm start from {spec.train.init_from}: {len(copied['copied'])} parameters copied, "
                      f"{len(copied['kept'])} freshly initialised ({', '.join(copied['kept'][:4])}"
                      f"{', ...' if len(copied['kept']) > 4 else ''})", flush=True)
        return state


def split_tokens_per_step(task_name: str, spec: RunSpec) -> int:
    """Tokens of the training split one step reads (for `epochs`): B packed rows of data.seq_len + 1 tokens each
    (T inputs and one more target; span corruption packs rows of its raw length + 1, then corrupts them)."""
    row = span_corruption_lengths(spec.data)[0] if task_name == "span_corruption" else int(spec.data.seq_len)
    return int(spec.train.batch_size) * (row + 1)


def check_group(configs: Sequence[Any], nproc: int) -> None:
    if len(configs) > 1 and nproc != 1:
        raise ConfigError(f"sweep.multirun trains a group in one process, but this job has {nproc} processes; "
                          f"set sweep.multirun=False")
    if len(configs) > 1 and len({multirun.group_key(c) for c in configs} | {None}) != 2:
        raise ValueError(f"a group's runs may differ only in train.{' and train.'.join(multirun.FREE_KEYS)} "
                         "(no dropout, no train.init_from)")


def prepare(configs: Sequence[Any], workdirs: Sequence[str], verbose: bool, get_task: Callable[[Any], Any],
            claim_dead: run_claim.DeadRule | None = None) -> tuple[Setup | None, Runs | None, list, list]:
    """Resolves the runs and checks their workdirs; returns (None, None, previous summaries, []) when every run
    has already finished, else the set-up, the runs (data found, config.json written, each workdir claimed:
    Runs.claims, released by the caller) and continue-from steps.

    The order is the contract "nothing is written before every check": a new workdir's writability, the spec
    (resolve), the workdirs' recorded configs, the model's shapes (abstract state) and train.init_from; then the
    claims (refusing a workdir another process trains); then the data (a data mistake releases the claims and
    leaves no new directory); only then the first write (the tokenizer's copy, config.json, the checkpoints)."""
    nproc, grouped = jax.process_count(), len(configs) > 1
    primary = jax.process_index() == 0
    for workdir in workdirs:
        if not os.path.exists(workdir):
            check_workdir_writable(workdir)  # a new run in a read-only place: one error, before anything else
    devices = jax.devices()[:1] if grouped else jax.devices()
    kept = [keep_recorded_warmup(c, w) for c, w in zip(configs, workdirs)]  # warm-up -1 on a recorded run: its own
    configs = [c for c, _ in kept]
    for c in configs:
        check_plain(c)  # the plain settings, before a dataset is prepared or a tokenizer trained
    if verbose and primary:
        for w, (_, warmup) in zip(workdirs, kept):
            if warmup is not None:
                print(f"{w}: keeping the warm-up its run resolved, {warmup} steps (train.warmup_steps=-1 on a "
                      f"workdir that holds a run)", flush=True)
    config = configs[0]
    data_spec = DataSpec.of(config["data"])  # a ConfigDict's data block or a plain dict's (a sweep's run config)
    identity.ensure_available(data_spec)  # a first run builds the dataset: its identity is recorded at once
    tokenizer = get_tokenizer(data_spec, workdir=workdirs[0], training=True)  # the recorded copy when resuming
    resolved_runs = [resolve(c, len(devices), nproc, tokenizer) for c in configs]
    resolved = [r.config for r in resolved_runs]
    specs = [r.spec for r in resolved_runs]  # below here every setting is read from the specs
    spec, t = specs[0], specs[0].train
    previous, continue_from = [], []
    for workdir, d in zip(workdirs, resolved):
        continue_from.append(check_workdir_config(workdir, json.loads(json.dumps(d))))  # a wsd run made longer
        path = os.path.join(workdir, "summary.json")
        previous.append(read_run_json(path) if os.path.exists(path) and continue_from[-1] is None else None)
    if all(p is not None and p.get("status") == "ok" for p in previous):
        if verbose and primary:
            print(f"{', '.join(workdirs)} already finished (status ok); nothing to do", flush=True)
        return None, None, previous, []

    model_cfg, mesh_shape = resolved_runs[0].model_cfg, resolved_runs[0].mesh_shape
    task, model = get_task(spec), build_model(model_cfg)
    tx = model_optimizer(model, t, task.init_inputs(spec))  # with μP's per-parameter LRs (SP: none)
    mesh, rules = sharding.make_mesh(spec.mesh, devices), sharding.rules(spec.mesh)
    abstract, shardings = abstract_state(model, tx, task.init_inputs(spec), mesh, rules)
    init_sources = [check_source(s.train.init_from, abstract.params, model_cfg.family, model_cfg)
                    if s.train.init_from and not has_checkpoint(w) else None for s, w in zip(specs, workdirs)]
    for source in init_sources:
        if source is not None:
            check_frozen_copied(model_cfg, source)
    for workdir in workdirs:
        check_workdir_writable(workdir)  # an existing run's (a finished one was only read, above)
    claims = run_claim.claim_workdirs(workdirs, primary, nproc, verbose, claim_dead)  # another live train: refused
    try:
        # this process's rows of a global batch: those its devices hold (a tensor/fsdp axis may span processes)
        rows = process_rows(sharding.batch_sharding(mesh, rules), (t.batch_size, spec.data.seq_len))
        # the data order: (data.shuffle_seed, train.seed) mixed by the pipeline (pipeline.shuffle_seed), never summed
        data_args = [dict(split=s.data.train_split, global_batch_size=t.batch_size, seed=s.train.seed, data=r.data,
                          rows=rows, process_index=jax.process_index(), process_count=nproc, shuffle=True,
                          repeat=True) for s, r in zip(specs, resolved_runs)]
        data_its = [task.make_iterator(s, **a) for s, a in zip(specs, data_args)]
        run_data = resolved_runs[0].data
        sets = (eval_sets.open_sets(run_data, run_data.ensure_cache(False), verbose and primary)
                if spec.data.eval_set_list else [])  # each tokenized once; a set of training data refused
        tasks = scoring.prepare_tasks(t.eval_tasks, t.eval_tasks_limit, run_data.tokenizer,
                                      scoring.layout_for(task.name, spec.data.seq_len), verbose and primary)
    except BaseException:
        claims.release(remove_created=True)  # a data mistake leaves no workdir (nor a half-made run) behind
        raise
    try:
        if primary:  # the first write
            for workdir, d in zip(workdirs, resolved):
                record_tokenizer(tokenizer, workdir)  # sampling and resuming need nothing outside the workdir
                write_json(os.path.join(workdir, "config.json"), d)
        decay_start = optimizer.decay_start(t)  # wsd: checkpointed and kept, a longer run continues from it
        ckpts = [checkpointing.Checkpointer(os.path.join(w, "checkpoints"), keep=t.keep_checkpoints,
                                            preserve=[decay_start] if decay_start else []) for w in workdirs]
        for ck, step_from in zip(ckpts, continue_from):
            if step_from is not None:
                ck.set_aside_after(step_from, f"continuing to {t.steps} steps from the decay start {step_from}")
    except BaseException:
        claims.release()
        raise
    setup = Setup(spec=spec, config=config, task=task, model=model, model_cfg=model_cfg, tx=tx, mesh=mesh, rules=rules,
                  mesh_shape=mesh_shape, devices=devices, abstract=abstract, shardings=shardings,
                  counts=param_counts(model_cfg), fpt=flops_per_token(model_cfg, spec.data.seq_len)["training"],
                  tokens_per_step=t.batch_size * spec.data.seq_len,  # per run
                  token_bytes_V=tokenizer.byte_lengths() if task.name == "lm" else None,  # for eval_bits_per_byte
                  train_split_tokens=getattr(data_its[0], "split_tokens", None),  # packed text: for `epochs`
                  split_tokens_per_step=split_tokens_per_step(task.name, spec),
                  decay_start=decay_start, data=resolved_runs[0].data, rows=rows,
                  vocab_size_unpadded=model_vocab_size(spec, tokenizer),
                  eval_train_overlap_documents=getattr(data_its[0], "eval_train_overlap_documents", None),
                  eval_sets=sets, eval_tasks=tasks)
    runs = Runs(configs=list(configs), specs=specs, workdirs=list(workdirs), resolved=resolved, data_args=data_args,
                data_its=data_its, ckpts=ckpts, grouped=grouped, primary=primary, claims=claims,
                init_sources=init_sources)
    return setup, runs, previous, continue_from


def check_frozen_copied(model_cfg: Any, source: Source) -> None:
    """Under LoRA every frozen parameter must come from train.init_from: one left at its initialisation would stay
    random for the whole run (a ConfigError naming them, before anything is written)."""
    if not model_cfg.lora.rank:
        return
    fresh = [k for k in source.kept if not lora.is_trained(model_cfg, _key_path(k))]
    if fresh:
        raise ConfigError(f"model.lora.rank={model_cfg.lora.rank} freezes every parameter but the adapters, and "
                          f"train.init_from={source.path!r} has no value for {', '.join(fresh[:4])}"
                          f"{' ...' if len(fresh) > 4 else ''}: frozen, they would stay at their random "
                          f"initialisation; start from a model with the same shape (or train without LoRA)")


def _key_path(keystr: str) -> tuple:
    """A jax keystr ("['blocks']['layers_0']['mlp']") as the tuple of names lora.is_trained reads."""
    return tuple(part.strip("'\"") for part in keystr.strip("[]").split("]["))


def has_checkpoint(workdir: str) -> bool:
    """Whether `workdir` holds a checkpoint step (a run that resumes: train.init_from is not read)."""
    directory = os.path.join(workdir, "checkpoints")
    return os.path.isdir(directory) and any(d.isdigit() for d in os.listdir(directory))


def restore_or_init(setup: Setup, runs: Runs, verbose: bool) -> tuple[int, Any]:
    """(start step, state): the runs' newest readable checkpoints, or fresh states; a group's stacked."""
    restored = [ck.restore(setup.abstract, it) for ck, it in zip(runs.ckpts, runs.data_its)]
    at = sorted({r[0] if r else 0 for r in restored})
    for ck, r, spec in zip(runs.ckpts, restored, runs.specs):
        if r and runs.primary:
            warn_earlier_lr_arithmetic(ck, r[0], spec)
    if len(at) > 1:
        raise multirun.GroupMismatch(f"the runs' checkpoints are at steps {at}; they continue one by one")
    run_states = [r[1] if r else setup.fresh_state(s, source, announce=verbose and runs.primary)
                  for r, s, source in zip(restored, runs.specs, runs.init_sources)]
    runs.init_sources = [x.light() if x is not None else None for x in runs.init_sources]  # tensors: not held
    if not runs.grouped:
        return at[0], run_states[0]  # the iterators are at global batch at[0], under any process count
    return at[0], jax.device_put(multirun.stack(run_states), multirun.with_run_axis(setup.shardings))


def warn_earlier_lr_arithmetic(ck: checkpointing.Checkpointer, step: int, spec: RunSpec) -> None:
    """A warning when checkpoint `step` was written under an earlier learning-rate arithmetic (its meta lacks
    spec.LR_ARITHMETIC's number) and the run has decaying steps left: those follow today's schedule (the decay one
    step further along, reaching train.final_lr_fraction at the last step), so the run does not end exactly as
    an uninterrupted run of the code that started it would have."""
    meta = ck.meta(step) or {}
    if meta.get("lr_arithmetic", 1) >= LR_ARITHMETIC or spec.train.schedule == "constant" or step >= spec.train.steps:
        return
    print(f"warning: checkpoint {step} in {ck.directory} was written under the earlier learning-rate schedule, whose "
          f"decay ran one step behind (its last step trained above train.final_lr_fraction); steps {step + 1} to "
          f"{spec.train.steps} follow today's, so this run differs slightly from one trained start to end with "
          f"either", flush=True)


def announce(setup: Setup, runs: Runs, start_step: int) -> None:
    c = runs.specs
    what = (f"group of {len(c)} runs (learning rates {', '.join(f'{x.train.learning_rate:.3g}' for x in c)})"
            if runs.grouped else runs.workdirs[0])
    trained = (f", {setup.counts['trainable']:,} trained (LoRA)" if setup.model_cfg.lora.rank else "")
    print(f"{setup.model_cfg.family} model: {setup.counts['total']:,} params ({setup.counts['non_embedding']:,} "
          f"non-embedding{trained}), {setup.fpt / 1e6:.2f} MFLOP/token; mesh {dict(zip(sharding.MESH_AXES, setup.mesh_shape))}; "
          f"{'resuming from step ' + str(start_step) if start_step else 'starting'}: {what}", flush=True)

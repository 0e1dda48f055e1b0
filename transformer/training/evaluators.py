"""The loop's evaluations, one registry (Levanter's `add_eval_hook(dataset, name)` is the model): `Evaluators`
holds named evaluations, each a callable `params -> {row key: value}` (a group's: R values per key), and the loop's
evaluation cadence calls the registry, never one of them by name. `build` registers, for a run: its own eval split
(eval_loss, eval_accuracy, eval_bits_per_byte), each named evaluation set of data.eval_sets (eval/NAME/...), and
each task of train.eval_tasks (tasks/NAME/...). A new kind of evaluation is one `add` here, not a case in the loop.
"""
from __future__ import annotations

from typing import Any, Callable

from transformer.spec import metric_keys
from transformer.training import multirun, scoring
from transformer.training.evaluation import Evaluator


class Evaluators:
    """Named evaluations called in the order added; their rows merged (row keys must not collide)."""

    def __init__(self) -> None:
        self._items: list[tuple[str, Callable[[Any], dict]]] = []

    def add(self, name: str, evaluate: Callable[[Any], dict]) -> None:
        """Registers `evaluate(params) -> {row key: value}` under `name` (unique)."""
        if any(name == n for n, _ in self._items):
            raise ValueError(f"an evaluation named {name!r} is registered already")
        self._items.append((name, evaluate))

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self._items]

    def __call__(self, params: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, evaluate in self._items:
            row = evaluate(params)
            clash = sorted(set(row) & set(out))
            if clash:
                raise ValueError(f"evaluation {name!r} reports {clash}, which another evaluation reported")
            out.update(row)
        return out

    def close(self) -> None:
        """Closes every evaluation that holds something open (an iterator's readers); all run, the first error
        is raised after."""
        first = None
        for _, evaluate in self._items:
            try:
                if hasattr(evaluate, "close"):
                    evaluate.close()
            except Exception as e:  # noqa: BLE001 - raised below, after the others closed
                first = first or e
        if first is not None:
            raise first


def build(setup: Any, eval_fn: Callable, batch_sharding: Any, process_index: int, process_count: int,
          runs: int = 0) -> Evaluators:
    """The run's registry (the module docstring): `setup` a run_setup.Setup (its task, spec, data, rows,
    token_bytes_V, eval_sets and eval_tasks), `eval_fn` the jitted eval step (vmapped for a group of `runs` > 0
    runs, whose parameters are stacked)."""
    evaluators = Evaluators()
    common = dict(token_bytes_V=setup.token_bytes_V, data=setup.data, rows=setup.rows)
    evaluators.add("eval", Evaluator(eval_fn, setup.task, setup.spec, batch_sharding, process_index, process_count,
                                     **common))
    for s in setup.eval_sets:
        evaluators.add(metric_keys.EVAL_SET_PREFIX + s.name,
                       Evaluator(eval_fn, setup.task, setup.spec, batch_sharding, process_index, process_count,
                                 cache=(s.path, s.split), keys=metric_keys.eval_set_keys(s.name), **common))
    if setup.eval_tasks:  # one scoring step for every task: rows of the run's batch shape
        params_sharding = multirun.with_run_axis(setup.shardings.params) if runs else setup.shardings.params
        layout = setup.eval_tasks[0].layout  # run_setup's, which every task was packed for
        scorer = scoring.Scorer(setup.model, setup.task, layout, setup.spec.train.batch_size,
                                params_sharding=params_sharding, batch_sharding=batch_sharding, rows=setup.rows,
                                runs=runs)
        for prepared in setup.eval_tasks:
            evaluators.add(metric_keys.TASK_PREFIX + prepared.task.name, scoring.TaskEvaluator(scorer, prepared))
    return evaluators

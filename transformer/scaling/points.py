"""Scaling-law data points: (N, D, C, loss) per run, from a CSV or a sweep directory.

Legend: P = number of points (finished runs), S = number of logged evaluations in one run's curve.

A CSV names at least `params`, `tokens`, `loss` in its header (`N` and `D` are accepted for params and
tokens, `--columns` maps other names; optional `flops`; when absent, C = 6·N·D; with flops, one of params and
tokens may be absent and is C / (6·the other), as published sweeps that give model size and compute have it);
`where={"column": "value"}` keeps the rows of one setting of a multi-setting file (e.g. Porian et al.'s
`experiment`); `csv_checks` holds what the rows must pass (text columns: a setting, a description, an identifier
or a per-point attribute; units; duplicates are merged).

A sweep directory follows the Sweep contract: `DIR/results.jsonl` holds one JSON object per finished run and
`DIR/runs/RUN_ID/metrics.jsonl` its logged metrics; the loss is `eval_loss`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from transformer.scaling import csv_checks, verdict
from transformer.scaling.csv_checks import parse_where  # noqa: F401 (re-exported)
from transformer.spec import ConfigError, MissingInputError, metric_keys

N_KINDS = ("params", "params_non_embedding")
CSV_REQUIRED = csv_checks.REQUIRED
CSV_ALIASES = csv_checks.ALIASES


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's loss curve: evaluations at increasing compute. Arrays are (S,)."""

    run_id: str
    params: float
    tokens_S: np.ndarray
    flops_S: np.ndarray
    loss_S: np.ndarray


@dataclasses.dataclass(frozen=True)
class Points:
    """Final (N, D, C, loss) of each kept run, arrays (P,), plus curves and exclusions.

    `excluded` lists `{"id": ..., "reason": ...}` for runs left out while loading.
    """

    params_P: np.ndarray
    tokens_P: np.ndarray
    flops_P: np.ndarray
    loss_P: np.ndarray
    ids: tuple[str, ...]
    curves: tuple[Curve, ...] = ()
    excluded: tuple[dict[str, str], ...] = ()
    source: str = ""
    budget_P: np.ndarray | None = None  # each run's designed IsoFLOP budget (sweeps), else None
    # Other per-point arrays, (P,) each: "params_total", "params_non_embedding", "flops_no_attention",
    # "params_unpadded" where the source has them (sweeps); see `conventions`.
    extra_P: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    flops_given: bool = True  # False: the source gave no compute (a CSV without flops), flops_P = 6·N·D
    # A sweep's runs by the environment they were computed in (transformer/environment.brief, recorded in each
    # results row): [{"environment": ..., "runs": count}], most runs first; () where the source records none.
    environments: tuple[dict[str, Any], ...] = ()
    metric: str = "eval_loss"  # what loss_P holds: a sweep's eval_loss, or the fitted metric (read_sweep's)
    notes: tuple[str, ...] = ()  # what reading the source did that the fit should say (fit.json "input_notes")

    def __len__(self) -> int:
        return len(self.loss_P)

    def subset(self, keep_P: np.ndarray, reason: str = "") -> "Points":
        """The points where `keep_P` (bool, (P,)) is true; the others are recorded as excluded."""
        keep_P = np.asarray(keep_P, dtype=bool)
        kept_ids = {i for i, k in zip(self.ids, keep_P) if k}
        dropped = tuple({"id": i, "reason": reason} for i, k in zip(self.ids, keep_P) if not k)
        return dataclasses.replace(
            self,
            params_P=self.params_P[keep_P],
            tokens_P=self.tokens_P[keep_P],
            flops_P=self.flops_P[keep_P],
            loss_P=self.loss_P[keep_P],
            budget_P=None if self.budget_P is None else self.budget_P[keep_P],
            extra_P={k: v[keep_P] for k, v in self.extra_P.items()},
            ids=tuple(i for i, k in zip(self.ids, keep_P) if k),
            curves=tuple(c for c in self.curves if c.run_id in kept_ids),
            excluded=self.excluded + dropped,
        )

    def take(self, index_K: np.ndarray) -> "Points":
        """Points at `index_K` (repeats allowed, for bootstrap resampling); curves are dropped."""
        return dataclasses.replace(
            self,
            params_P=self.params_P[index_K],
            tokens_P=self.tokens_P[index_K],
            flops_P=self.flops_P[index_K],
            loss_P=self.loss_P[index_K],
            budget_P=None if self.budget_P is None else self.budget_P[index_K],
            extra_P={k: v[index_K] for k, v in self.extra_P.items()},
            ids=tuple(self.ids[i] for i in index_K),
            curves=(),
        )

    def canonical(self) -> "Points":
        """The points in one order whatever the order of the rows read (compute, N, D, loss, id): every fit and
        noise draw then gives the same result for the same runs. Curves stay as they are."""
        order_P = np.lexsort((np.array(self.ids, dtype=object).astype(str), self.loss_P, self.tokens_P,
                              self.params_P, self.flops_P))
        return dataclasses.replace(self.take(order_P), curves=self.curves)

    def as_records(self) -> list[dict[str, Any]]:
        """The points as JSON-ready dicts."""
        return [
            {"id": i, "params": float(n), "tokens": float(d), "flops": float(c), "loss": float(l)}
            for i, n, d, c, l in zip(self.ids, self.params_P, self.tokens_P, self.flops_P, self.loss_P)
        ]


def from_arrays(
    params: Sequence[float],
    tokens: Sequence[float],
    loss: Sequence[float],
    flops: Sequence[float] | None = None,
    ids: Sequence[str] | None = None,
    source: str = "arrays",
) -> Points:
    """Points from arrays; flops default to 6·N·D. Values must be positive and finite."""
    params_P = np.asarray(params, dtype=float)
    tokens_P = np.asarray(tokens, dtype=float)
    loss_P = np.asarray(loss, dtype=float)
    flops_P = 6.0 * params_P * tokens_P if flops is None else np.asarray(flops, dtype=float)
    for name, x in (("params", params_P), ("tokens", tokens_P), ("flops", flops_P), ("loss", loss_P)):
        if x.shape != params_P.shape or x.ndim != 1:
            raise ConfigError(f"{source}: {name} has shape {x.shape}; expected {params_P.shape}")
        if not np.all(np.isfinite(x) & (x > 0)):
            raise ConfigError(f"{source}: {name} must be positive finite numbers")
    ids = tuple(ids) if ids is not None else tuple(f"p{i}" for i in range(len(params_P)))
    return Points(params_P, tokens_P, flops_P, loss_P, ids, source=source, flops_given=flops is not None)


def read_csv(path: str, where: dict[str, str] | None = None, columns: dict[str, str] | None = None) -> Points:
    """Points from a CSV whose header names params, tokens, loss (and optionally flops), checked as `csv_checks`
    says: `columns` maps other names ({"params": "parameter_count"}; `N`/`D` are aliases of params/tokens), `where`
    keeps only rows whose columns equal the given values (when it matches nothing the error lists the settings the
    file holds), an identifier column is ignored with a note, rows equal in params, tokens, flops and loss are
    merged (never seed replicates), and the units are checked. Row ids are `row<L>` with L the file's line number
    (the header is line 1).
    """
    if not os.path.isfile(path):
        problem = "is a directory, not a points file" if os.path.isdir(path) else "no such points file"
        raise MissingInputError(f"{path}: {problem} (expected a CSV with columns params,tokens,loss)")
    where, columns = where or {}, columns or {}
    raw_header, table = csv_checks.read_table(path)
    header = csv_checks.header_names(path, raw_header, columns)
    missing = [c for c in CSV_REQUIRED if c not in header]
    # One of params and tokens may be absent where flops is given: it is C / (6·the other), the 6·N·D convention.
    derived = missing[0] if len(missing) == 1 and missing[0] in csv_checks.DERIVABLE and "flops" in header else None
    if missing and derived is None:
        raise ConfigError(
            f"{path}: column '{missing[0]}' is missing; the header must name params (or N), tokens (or D), loss "
            f"(optional flops; with flops, one of params and tokens may be absent: C = 6·N·D gives it; "
            f"--columns=params=COLUMN,... maps other names), found: {', '.join(raw_header) or 'no header'}"
        )
    unknown = [c for c in where if c not in header]
    if unknown:
        raise ConfigError(f"{path}: --where names column '{unknown[0]}', which the file does not have; "
                         f"columns: {', '.join(raw_header)}")
    rows = [(line, dict(zip(header, cells))) for line, cells in table]
    has_flops = "flops" in header
    values: dict[str, list[float]] = {c: [] for c in csv_checks.NUMERIC}
    lines, kept = [], []
    for line, row in rows:
        if any((row.get(c) or "").strip() != v for c, v in where.items()):
            continue
        for c in [c for c in CSV_REQUIRED if c != derived] + (["flops"] if has_flops else []):
            values[c].append(csv_checks.positive_number(path, line, csv_checks.label(c, columns),
                                                        (row.get(c) or "").strip()))
        lines.append(line)
        kept.append(row)
    all_rows = [r for _, r in rows]
    if not lines and where:
        listed = csv_checks.settings(all_rows, csv_checks.text_columns(header, all_rows, all_rows, where)[0]
                                     or list(where))
        raise ConfigError(f"{path}: no rows match --where {' '.join(f'{c}={v}' for c, v in where.items())}; "
                         f"the file holds {len(listed)} setting(s): " + "; ".join(listed))
    if not lines:
        raise ConfigError(f"{path}: no data rows after the header")
    setting, identifiers, per_point = csv_checks.text_columns(header, all_rows, kept, where)
    mixed = csv_checks.settings(kept, setting) if setting else []
    if len(mixed) > 1:
        raise ConfigError(f"{path}: the rows kept mix {len(mixed)} settings; pick one with --where COLUMN=VALUE "
                         f"(repeatable), one of: " + "; ".join(mixed))
    arrays = {c: np.array(v, float) for c, v in values.items() if c != derived}
    notes = []
    if derived is not None:
        other = csv_checks.DERIVABLE[derived]
        arrays[derived] = arrays["flops"] / (6.0 * arrays[other])
        notes.append(f"column '{derived}' absent: {derived} = flops / (6·{other}) on every row (C = 6·N·D)")
    if not has_flops:
        arrays["flops"] = 6.0 * arrays["params"] * arrays["tokens"]
    csv_checks.check_units(path, lines, arrays, has_flops, columns, derived=derived)
    source = path + (f" [{', '.join(f'{c}={v}' for c, v in where.items())}]" if where else "")
    points = from_arrays(arrays["params"], arrays["tokens"], arrays["loss"],
                         flops=arrays["flops"] if has_flops else None, ids=[f"row{n}" for n in lines], source=source)
    notes += [f"column '{c}' differs on every row: an identifier of the run, ignored" for c in identifiers]
    notes += [f"column '{c}' has {len(csv_checks.settings(kept, [c]))} values over {len(kept)} rows, most "
              f"on fewer than {csv_checks.MIN_SETTING_ROWS}: it describes points, not a setting to pick; ignored"
              for c in per_point]
    return merge_duplicates(dataclasses.replace(points, notes=tuple(notes)), "row")


def merge_duplicates(points: Points, what: str = "run") -> Points:
    """The points with each repeated point (equal params, tokens, flops and loss: a row or run listed twice) kept
    once, the others excluded with a note (`what`: how the note names them). Counted twice they would be seed
    replicates of zero spread and shrink σ and every interval."""
    pairs = csv_checks.duplicates(np.stack([points.params_P, points.tokens_P, points.flops_P, points.loss_P]))
    if not pairs:
        return points
    keep_P = np.ones(len(points), bool)
    keep_P[[p for p, _ in pairs]] = False
    merged = points.subset(keep_P)
    named = ", ".join(f"{points.ids[p]} = {points.ids[q]}" for p, q in pairs[:10]) + (
        f" and {len(pairs) - 10} more" if len(pairs) > 10 else "")
    note = (f"{len(pairs)} duplicate {what}(s) merged ({named}): equal params, tokens, flops and loss, kept once and "
            "not counted as seed replicates (seeds whose losses round to one value: give the losses with more digits)")
    excluded = points.excluded + tuple({"id": points.ids[p], "reason": f"duplicate of {points.ids[q]} (equal params, "
                                        "tokens, flops and loss): merged"} for p, q in pairs)
    return dataclasses.replace(merged, excluded=excluded, notes=points.notes + (note,))


def _read_jsonl(path: str) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    """(line number, object) for each JSON-object line, and the numbers of lines that are not one.

    A line can be torn when a writer is killed mid-write; such lines are reported, not fatal.
    """
    records, bad = [], []
    with open(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict):
                records.append((line_no, record))
            else:
                bad.append(line_no)
    return records, bad


def _finite_positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _read_curve(path: str, run_id: str, params: float, metric: str = "eval_loss") -> Curve | None:
    """The run's evaluation curve of `metric` (rows with a finite one), or None without metrics."""
    if not os.path.isfile(path):
        return None
    rows = [
        r for _, r in _read_jsonl(path)[0]
        if all(_finite_positive(r.get(k)) for k in (metric, "tokens", "flops"))
    ]
    if not rows:
        return None
    rows.sort(key=lambda r: r["flops"])
    flops_S = np.array([r["flops"] for r in rows], dtype=float)
    keep_S = np.concatenate([[True], np.diff(flops_S) > 0])  # one row per compute value
    return Curve(
        run_id=run_id,
        params=params,
        tokens_S=np.array([r["tokens"] for r in rows], dtype=float)[keep_S],
        flops_S=flops_S[keep_S],
        loss_S=np.array([r[metric] for r in rows], dtype=float)[keep_S],
    )


def _flops_no_attention(record: dict[str, Any]) -> float | None:
    """The run's FLOPs without the attention-score term: flops − tokens·12·L·T·heads·head_dim (the
    `with_attention − six_n` difference of `accounting.flops_per_token`, from the row's shape keys);
    None when the row lacks them."""
    keys = ("num_layers", "seq_len", "num_heads", "head_dim")
    if not all(_finite_positive(record.get(k)) for k in (*keys, "flops", "tokens")):
        return None
    layers, seq_len, heads, head_dim = (float(record[k]) for k in keys)
    return float(record["flops"]) - float(record["tokens"]) * 12.0 * layers * seq_len * heads * head_dim


def read_sweep(directory: str, n_kind: str = "params", metric: str = "eval_loss") -> Points:
    """Points from a sweep directory's results.jsonl (+ each run's metrics.jsonl curve, except wsd runs').

    Runs whose verdict (scaling/verdict.py: failed, or diverged, a finite loss above the uniform guess or above
    where the run started included) is not "ok" are excluded with a reason, as are lines that are not JSON (torn writes); a run listed twice keeps its last line. `n_kind` picks N: "params" (total) or
    "params_non_embedding". `metric`: what is fitted as the loss, a results row's key (eval_loss,
    eval_bits_per_byte) or a named set's or task's (spec.metric_keys: eval/NAME/bits_per_byte,
    tasks/NAME/bits_per_byte): a run without a finite positive value is left out with the reason; a metric no row
    has is a ConfigError naming the ones they have.
    """
    if n_kind not in N_KINDS:
        raise ConfigError(f"n_kind={n_kind!r} is not valid; choose one of {', '.join(N_KINDS)}")
    results = os.path.join(directory, "results.jsonl")
    if not os.path.isfile(results):
        raise MissingInputError(f"{results}: no such file; --sweep must be a sweep directory with results.jsonl")
    by_id: dict[str, tuple[int, dict[str, Any]]] = {}
    records, bad_lines = _read_jsonl(results)
    excluded = [{"id": f"line{n}", "reason": "not a JSON object (a torn write?)"} for n in bad_lines]
    for line_no, record in records:
        run_id = str(record.get("run_id", f"line{line_no}"))
        if run_id in by_id:
            excluded.append({"id": run_id, "reason": f"line {by_id[run_id][0]} superseded by line {line_no}"})
        by_id[run_id] = (line_no, record)
    params, tokens, flops, loss, ids, curves, budgets, environments = [], [], [], [], [], [], [], {}
    extras: dict[str, list[float]] = {"params_total": [], "params_non_embedding": [], "flops_no_attention": [],
                                      "params_unpadded": []}
    for run_id, (line_no, record) in by_id.items():
        role = record.get("role", "grid")
        if role != "grid":  # a staged sweep's LR calibration, schedule check or validation run (plan.py)
            excluded.append({"id": run_id, "reason": f"role={role!r}: not an IsoFLOP grid run"})
            continue
        status, why = verdict.verdict(record)  # the one failure rule: a finite but diverged loss is no point
        if status != verdict.OK:
            excluded.append({"id": run_id, "reason": f"status={status!r} (not 'ok')" + (f": {why}" if why else "")})
            continue
        if not _finite_positive(metric_keys.value(record, metric)):
            excluded.append({"id": run_id, "reason": f"{metric}={metric_keys.value(record, metric)!r} is not finite "
                                                     f"and positive"})
            continue
        for key in (n_kind, "tokens", "flops"):
            if not _finite_positive(record.get(key)):
                raise ConfigError(
                    f"{results}: line {line_no} (run {run_id}), key '{key}' = {record.get(key)!r} "
                    "must be a positive finite number"
                )
        ids.append(run_id)
        params.append(float(record[n_kind]))
        tokens.append(float(record["tokens"]))
        flops.append(float(record["flops"]))
        loss.append(float(metric_keys.value(record, metric)))
        budgets.append(record.get("budget"))
        if record.get("environment"):
            key = json.dumps(record["environment"], sort_keys=True)
            environments[key] = environments.get(key, 0) + 1
        extras["params_total"].append(record.get("params"))
        extras["params_non_embedding"].append(record.get("params_non_embedding"))
        extras["flops_no_attention"].append(_flops_no_attention(record))
        extras["params_unpadded"].append(record.get("params_unpadded"))  # runs since issue 19 record it
        # A wsd run's intermediate evaluations are not decayed (its branches' final points are): no curve.
        curve = None if record.get("schedule") == "wsd" else _read_curve(
            os.path.join(directory, "runs", run_id, "metrics.jsonl"), run_id, params[-1], metric)
        if curve is not None:
            curves.append(curve)
    if not ids:
        if metric != "eval_loss" and not any(metric_keys.value(r, metric) is not None for _, r in by_id.values()):
            known = sorted({k for _, r in by_id.values() for k in metric_keys.flat(r)} | {"eval_loss",
                                                                                       "eval_bits_per_byte"})
            raise ConfigError(f"--metric={metric}: no run of {results} records it; recorded: {', '.join(known)}")
        raise ConfigError(f"{results}: no finished runs with status 'ok' and a finite {metric}")
    points = from_arrays(params, tokens, loss, flops=flops, ids=ids, source=directory)
    budget_P = np.array(budgets, dtype=float) if all(_finite_positive(b) for b in budgets) else None
    extra_P = {k: np.array(v, dtype=float) for k, v in extras.items() if all(_finite_positive(x) for x in v)}
    by_count = sorted(environments.items(), key=lambda kv: -kv[1])
    return merge_duplicates(dataclasses.replace(
        points, curves=tuple(curves), excluded=tuple(excluded), budget_P=budget_P, extra_P=extra_P,
        environments=tuple({"environment": json.loads(k), "runs": n} for k, n in by_count), metric=metric))


def load(source: str, n_kind: str = "params") -> Points:
    """Points from a sweep directory (a directory) or a CSV file (anything else)."""
    if os.path.isdir(source):
        return read_sweep(source, n_kind=n_kind)
    return read_csv(source)

"""What a sweep's results row says about its run: the one failure rule (ok / failed / diverged).

Every reader of results rows uses it: the sweep's design and reports (transformer/sweeps/execute.read_rows), the
LR-scan analysis (lr_scan.py), the fit's points (points.read_sweep) and compare's finished-sweep check. It lives
here, the lowest layer that reads rows; sweeps/execute.py re-exports it.

  OK        the run finished with a loss that is a point of the fit
  DIVERGED  the run ended in a loss that says it diverged: an observation of its learning rate (worse than every
            finite rate), never a point of the fit, and not trained again by --retry_failed
  FAILED    the run did not finish for another reason (a killed worker, an error): it says nothing; --retry_failed
            trains it again
"""
from __future__ import annotations

import math
from typing import Any

OK, FAILED, DIVERGED = "ok", "failed", "diverged"
# What a diverged run's row says: training/nonfinite.describe's diagnosis in `error` (train.nonfinite="stop").
_DIVERGED_MARKS = ("non-finite", "nonfinite")


def verdict(row: dict[str, Any]) -> tuple[str, str | None]:
    """(status, reason) of a results row, rows recorded before this rule included.

    DIVERGED: a non-finite loss (the loop's non-finite error, or a null eval loss: summary.json writes a non-finite
    loss as null); a final eval or train loss above ln(vocab_size_unpadded), the loss of a uniform guess; or an
    eval loss above `initial_loss` (the train loss the run logged first: it ended worse than it started).
    FAILED: any other run that did not finish. Else OK."""
    status = row.get("status")
    if status == DIVERGED:
        return DIVERGED, row.get("error")
    if status == FAILED and any(m in str(row.get("error") or "").lower() for m in _DIVERGED_MARKS):
        return DIVERGED, row.get("error")
    if status != OK:
        return FAILED, row.get("error")
    loss = row.get("eval_loss")
    if loss is None or not math.isfinite(float(loss)):
        return DIVERGED, row.get("error") or "its eval loss is not finite"
    loss = float(loss)
    vocab = row.get("vocab_size_unpadded")
    for name in ("eval_loss", "train_loss") if vocab else ():
        value = row.get(name)
        if isinstance(value, (int, float)) and not value <= math.log(vocab):  # NaN too
            return DIVERGED, (f"its {'eval' if name == 'eval_loss' else 'final train'} loss {value:.4g} is above "
                              f"ln {vocab} = {math.log(vocab):.4g}, the loss of a uniform guess")
    start = row.get("initial_loss")
    if start is not None and math.isfinite(start) and loss > start:
        return DIVERGED, f"its eval loss {loss:.4g} is above the train loss it logged first ({start:.4g})"
    return OK, None


def canonical(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its status (and, where the status is derived, the reason in `error`) as `verdict` says."""
    status, reason = verdict(row)
    if status == row.get("status") and (reason is None or row.get("error")):
        return row
    return {**row, "status": status, "error": row.get("error") or reason}


def diverged(row: dict[str, Any]) -> bool:
    """Whether a results row is a run that diverged (an observation: worse than every finite run)."""
    return verdict(row)[0] == DIVERGED


def observed(row: dict[str, Any]) -> bool:
    """Whether a row tells something about its run's learning rate: finished or diverged, not failed."""
    return verdict(row)[0] != FAILED

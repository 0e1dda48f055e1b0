"""Weights & Biases as one more metrics sink (logging.wandb; off by default; `pip install '.[wandb]'`).

MetricsWriter (metrics.py) owns one WandbRun per workdir and hands it every row it writes to
metrics.jsonl, with its step; the run's config is the resolved config (DIR/config.json) and its summary
is summary.json. The W&B run id is kept in DIR/wandb_id, so a resumed run logs to the same W&B run
(resume="allow"; offline, each invocation writes its own DIR/wandb/offline-run-*-ID directory, and
`wandb sync --id ID` uploads them in order of their start to that one run).

W&B steps only increase, so rows are never sent twice: a resumed run does not send again the rows of
steps an earlier invocation may already have logged (those after the restored checkpoint, which the
JSONL file drops and retrains); W&B keeps the earlier values there, which an exact resume reproduces
(train_loss, eval_loss; the timing columns differ). When W&B is switched on for a workdir that already
has rows, they are sent first, so the W&B run holds the whole history.
"""
from __future__ import annotations

import os
import secrets
import string
from typing import Any

from transformer.spec import ConfigError

MODES = ("online", "offline")


def enabled(config: Any) -> bool:
    """logging.wandb of a config (a ConfigDict or the resolved dict); off where the config has no logging
    section (one written before it existed). The other logging.wandb_* keys come from configs/common.py."""
    return bool((config.get("logging") or {}).get("wandb", False))


def check(config: Any) -> None:
    """ConfigError, before any training, when logging.wandb is on but unusable."""
    if not enabled(config):
        return
    s = config["logging"]
    if s["wandb_mode"] not in MODES:
        raise ConfigError(f"logging.wandb_mode={s['wandb_mode']!r} is not valid; choose one of {', '.join(MODES)}")
    if not s["wandb_project"]:
        raise ConfigError("logging.wandb_project is empty; name the W&B project to log to")
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("logging.wandb=True needs the wandb package: pip install 'transformer[wandb]' "
                          "(or `pip install -e '.[wandb]'` in a checkout), or set logging.wandb=False") from None


def _new_id() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbRun:
    """One workdir's W&B run. `history`: the rows metrics.jsonl kept (steps <= the restored checkpoint);
    `logged_through`: the last step an earlier invocation may have logged (the file's last row before
    it was cut back to the checkpoint), 0 for a new run."""

    def __init__(self, workdir: str, config: dict, history: list[dict], logged_through: int):
        import wandb

        s = config["logging"]
        id_path = os.path.join(workdir, "wandb_id")
        resumed = os.path.exists(id_path)
        if resumed:
            with open(id_path) as f:
                self.id = f.read().strip()
        else:
            self.id = _new_id()
            with open(id_path + ".tmp", "w") as f:
                f.write(self.id + "\n")
            os.replace(id_path + ".tmp", id_path)
        self.run = wandb.init(
            project=s["wandb_project"], entity=s["wandb_entity"] or None, group=s["wandb_group"] or None,
            name=os.path.basename(os.path.normpath(workdir)), id=self.id, resume="allow", mode=s["wandb_mode"],
            dir=None if os.environ.get("WANDB_DIR") else workdir, config=config,
            reinit="create_new")  # a group of runs (sweep.multirun) holds one W&B run each, at once
        self.last_step = logged_through if resumed else 0
        for row in history:  # W&B switched on for a run that already has rows: its history first (a resumed
            # W&B run has these steps already, and log() skips them)
            self.log(row["step"], {k: v for k, v in row.items() if k != "step"})

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Sends one metrics row unless W&B already has this step (see the module docstring)."""
        if step <= self.last_step:
            return
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)  # NaN too
        self.last_step = step

    def finish(self, summary: dict | None) -> None:
        """summary.json becomes the W&B summary; a failed run is marked failed, a preempted one preempting."""
        if summary is not None:
            self.run.summary.update(summary)
            if summary.get("status") == "preempted":
                self.run.mark_preempting()
        self.run.finish(exit_code=1 if summary is not None and summary.get("status") == "failed" else 0)

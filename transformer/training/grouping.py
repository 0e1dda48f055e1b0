"""Which runs may train as one vmapped group (sweep.multirun): the one rule, standard library only, so the sweep's
dry run (no JAX) groups runs exactly as the runner and the loop do. The run axis itself is multirun.py's."""
from __future__ import annotations

import json
from typing import Any

FREE_KEYS = ("learning_rate", "seed")  # the train.* settings in which a group's runs may differ


def group_key(config: Any) -> str | None:
    """Runs with the same key can train as one group; None: this run trains alone (dropout masks
    follow the step's one seed; warm starts are per run)."""
    c = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else config))  # ConfigDict or dict
    if c["model"].get("dropout_rate", 0) or c["train"].get("init_from"):
        return None
    c["train"] = {k: v for k, v in c["train"].items() if k not in FREE_KEYS}
    return json.dumps(c, sort_keys=True)

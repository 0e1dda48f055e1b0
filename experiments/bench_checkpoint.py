"""Time one checkpoint save of a preset's freshly initialised train state, and its state digest alone.

python -m experiments.bench_checkpoint --config=configs/lm.py:llama_small [--config.model.vocab_size=32768]
    [--repeats=3] [--json]

`save_seconds`: Checkpointer.save (the digest included) until the asynchronous write has finished;
`blocking_seconds`: the part before save() returns, which training waits for; `digest_seconds`: the
state digest alone (checkpointing.state_digest). Medians over --repeats saves into a temporary directory.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time

from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", "configs/lm.py:llama_small", "Model config and preset.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Saves to time (the median is reported).", lower_bound=1)
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object.")


def main(argv: list[str]) -> None:
    del argv
    import grain
    import jax

    from transformer.models import build_model
    from transformer.training import checkpointing, sharding
    from transformer.training.resolve import model_config
    from transformer.training.optimizer import make_optimizer
    from transformer.training.state import init_state

    config = _CONFIG.value
    model_cfg = model_config(config, 259)
    model, tx = build_model(model_cfg), make_optimizer(config.train)
    mesh, rules = sharding.make_mesh(config.mesh), sharding.rules(config.mesh)
    import numpy as np
    state, _ = init_state(model, tx, 0, (np.zeros((1, 8), np.int32),), mesh, rules)
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    data_it = iter(grain.MapDataset.range(10).to_iter_dataset())
    saves, blocking, digests = [], [], []
    for r in range(_REPEATS.value):
        t0 = time.perf_counter()
        digest = checkpointing.state_digest(state)
        digests.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as d:
            ck = checkpointing.Checkpointer(d, keep=1)
            t0 = time.perf_counter()
            ck.save(r + 1, state, data_it, {"bench": True}, force=True)
            blocking.append(time.perf_counter() - t0)
            ck.wait()
            saves.append(time.perf_counter() - t0)
            ck.close()
    out = {"preset_params": int(sum(x.size for x in jax.tree.leaves(state.params))), "state_bytes": int(state_bytes),
           "save_seconds": statistics.median(saves), "blocking_seconds": statistics.median(blocking),
           "digest_seconds": statistics.median(digests), "digest_computed": digest is not None,
           "devices": jax.device_count()}
    if _JSON.value:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    cli.run(main)

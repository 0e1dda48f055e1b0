"""Step times of several configs measured in alternating rounds in one process (the CPU is shared: alternating
spreads the load changes over all of them). Usage, from the repository root:
    PYTHONPATH=. python docs/figures/lora_heads/step_times.py lora|pruned [ROUNDS]"""
import json, statistics, sys
import jax
from configs import mlm
from experiments.bench import build, time_steps

def lora(r):
    c = mlm.get_config("default,classify")
    c.model.update(dict(num_layers=4, num_heads=4)); c.data.seq_len = 128; c.train.batch_size = 32
    c.model.lora.rank = r; c.model.lora.targets = "query,key,value,out,mlp_in,mlp_out"
    c.train.init_from = "runs/lab/mlm"
    return c

def pruned(k):
    c = mlm.get_config("bert_small"); c.data.seq_len = 256; c.train.batch_size = 8
    c.model.pruned_heads = json.dumps({f"encoder/blocks/layers_{i}/attention": list(range(k)) for i in range(4)}) if k else ""
    return c

kind = sys.argv[1]
configs = {f"lora r={r}": lora(r) for r in (0, 4, 8, 16)} if kind == "lora" else \
          {f"{k}/8 heads pruned": pruned(k) for k in (0, 2, 4, 6)}
built = {name: build(c, jax.devices()[:1]) for name, c in configs.items()}
states = {n: b["state"] for n, b in built.items()}
times = {n: [] for n in built}
for n, b in built.items():  # warm-up
    states[n], _ = time_steps(b["compiled"], states[n], b["batch"], 2)
ratios = {n: [] for n in built}
first = next(iter(built))
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
    this = {}
    for n, b in built.items():
        states[n], t = time_steps(b["compiled"], states[n], b["batch"], 3)
        times[n] += t
        this[n] = statistics.median(t)
    for n in built:
        ratios[n].append(this[n] / this[first])
out = {n: {"median_step_seconds": statistics.median(t), "min_step_seconds": min(t), "steps": len(t), "median_ratio_to_first": statistics.median(ratios[n]),
           "temp_bytes": built[n]["compiled"].memory_analysis().temp_size_in_bytes,
           "argument_bytes": built[n]["compiled"].memory_analysis().argument_size_in_bytes} for n, t in times.items()}
print(json.dumps(out, indent=1))

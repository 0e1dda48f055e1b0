"""Settings shared by every family's config: data, training, mesh, distributed, logging."""
from __future__ import annotations

import ml_collections

# Logical axis name -> mesh axis (or axes, or None). Parameters and activations use DIFFERENT names,
# so each rule says what one kind of axis does and the order of the rules does not matter:
#   activations (nn.with_logical_constraint in the model; the input batch in training/sharding.py)
#     batch        the batch: data parallelism over (data, fsdp) — FSDP is data parallelism too
#     seq          the sequence: whole
#     act_embed    the model width of the residual stream: whole (FSDP shards weights, not activations)
#     act_heads, act_kv_heads, act_mlp, act_vocab   tensor parallelism (Megatron): split over tensor
#     act_head_dim whole
#   parameters (nn.with_logical_partitioning)
#     embed        the model-width axis of every weight: split over fsdp (ZeRO-3)
#     heads, kv_heads, mlp, vocab   split over tensor; head_dim, norm, classes, positions (the
#                  rows of the learned position table) whole
#     layers       the stacked axis of scanned layers (model.scan_layers): whole
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_head_dim", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("norm", None),
    ("classes", None),
    ("positions", None),
    ("layers", None),
)


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict()  # filled by the family's config file

    c.data = ml_collections.ConfigDict()
    c.data.tfds_name = "stdlib_py"    # the built-in corpus; any TFDS text dataset by name
    c.data.data_dir = ""              # "" -> $TFDS_DATA_DIR or ~/tensorflow_datasets
    c.data.text_feature = "text"
    c.data.train_split = "train"
    c.data.eval_split = "validation"
    c.data.files = ""                 # local files: comma-separated globs of .txt/.jsonl/.jsonl.gz/.parquet (replaces tfds_name)
    c.data.eval_files = ""            # "" -> hold out data.eval_fraction of data.files (by a hash of each document)
    c.data.eval_fraction = 0.01
    c.data.eval_sets = ""             # named evaluation sets: "name=globs;name2=heldout" (docs/evaluation.md)
    c.data.cache_dir = ""             # token cache (every source); "" -> next to a TFDS dataset, ~/.cache/transformer for files
    c.data.tokenizer = "bytes"        # bytes | sentencepiece | a SentencePiece .model path | a tokenizer.json path
    c.data.vocab_size = 1024          # sentencepiece only
    c.data.seq_len = 256
    c.data.shuffle_seed = 0
    c.data.worker_count = 0           # grain worker processes (0: read in the main process)

    c.train = ml_collections.ConfigDict()
    c.train.task = ""                 # "" = the model family's default (decoder: lm); see transformer/tasks
    c.train.init_from = ""            # a train workdir whose latest parameters initialise this run (fine-tuning)
    c.train.steps = 1000
    c.train.batch_size = 16           # global, across all processes
    c.train.grad_accum_steps = 1      # k > 1: each update sums k micro-batches of batch_size/k rows (less memory)
    c.train.learning_rate = 1e-3
    c.train.warmup_steps = -1           # -1: min(100, 10% of train.steps); an explicit count must be <= steps
    c.train.schedule = "cosine"       # cosine | linear | constant | wsd (warm-up, stable, decay)
    c.train.final_lr_fraction = 0.1   # decay ends at this fraction of the peak
    c.train.decay_fraction = 0.2      # wsd: the last fraction of train.steps spent decaying ("1 - sqrt" shape)
    c.train.weight_decay = 0.1
    c.train.b1 = 0.9
    c.train.b2 = 0.95
    c.train.eps = 1e-8
    c.train.grad_clip = 1.0           # global norm; 0 disables
    c.train.seed = 0
    c.train.log_every = 10
    c.train.eval_every = 200
    c.train.eval_steps = 8
    c.train.eval_tasks = ""           # likelihood-scored tasks at every evaluation: "arc_easy,hellaswag,NAME=FILE.jsonl"
    c.train.eval_tasks_limit = 0      # documents per task (0: all; the first ones in file order)
    c.train.checkpoint_every = 200
    c.train.keep_checkpoints = 3
    c.train.compute_dtype = "float32"  # float32 | bfloat16 (the one compute-dtype setting); parameters stay float32
    c.train.loss_chunk_size = 0       # >0: cross-entropy in sequence chunks of this size (large vocabularies)
    c.train.nonfinite = "stop"        # stop | skip: what a non-finite loss or gradient does
    c.train.max_skipped_fraction = 0.1  # skip: a run that drops more than this share of train.steps fails

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1                  # -1: all remaining devices
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    c.mesh.rules = DEFAULT_RULES

    # What a run reports about itself, never what it computes: left out of a sweep run's id, and may change
    # when a run resumes (transformer/training/wandb_run.py, profiler.py).
    c.logging = ml_collections.ConfigDict()
    c.logging.wandb = False           # also log metrics rows, config and summary to Weights & Biases (extra: wandb)
    c.logging.wandb_project = "transformer"
    c.logging.wandb_entity = ""       # "" -> your default W&B entity
    c.logging.wandb_mode = "online"   # online | offline (files under DIR/wandb/; upload later with `wandb sync`)
    c.logging.wandb_group = ""        # "" -> none; a sweep's runs get the sweep directory's name
    c.logging.profile_start = 0       # >0: trace steps profile_start .. +profile_count-1 into DIR/profile/
    c.logging.profile_count = 5       # (steps numbered as in metrics.jsonl: step 1 is the first update)

    c.distributed = ml_collections.ConfigDict()
    c.distributed.coordinator_address = ""
    c.distributed.num_processes = 0   # 0: a single process, or what the cluster's environment says
    c.distributed.process_id = -1
    return c

"""LoRA adapters <-> Hugging Face `peft`'s format: adapter_config.json + adapter_model.safetensors.

`to_peft(cfg, params, OUT)` writes a LoRA model's adapters (model.lora) so that
`peft.PeftModel.from_pretrained(base, OUT)` over the Hugging Face form of its frozen base (what `experiments.export`
writes of the base, or the checkpoint train.init_from named) computes this model's logits; `from_peft(OUT, cfg,
params)` reads such a directory (ours or one peft wrote) into this codebase's adapters. peft's LoRA on an
nn.Linear (out, in) is W + s·B A with lora_A (r, in), lora_B (out, r), s = lora_alpha / r; ours on a kernel
(in..., out...) is W + s·A B with A (in..., r), B (r, out...) (layers/lora.py): the same matrices transposed,
the head axes flattened as the converters flatten them (tensors.from_heads_in / from_heads_out).

The sites (`sites`): each projection of each layer and the Hugging Face module that holds it, in the module
names of the class export writes (GPT2LMHeadModel, LlamaForCausalLM, Qwen3ForCausalLM, BertForMaskedLM,
T5ForConditionalGeneration). GPT-2's c_attn holds query, key and value side by side: their adapters become one
c_attn adapter of rank r·(targets among them), A stacked and B block-diagonal (rank_pattern and alpha_pattern keep
s), which is exactly their sum; reading one back, each third of B's rows keeps the columns it uses. Reading
folds each module's own scale into its B and pads ranks with zeros, so any rank_pattern / alpha_pattern reads
exactly. GPT-NeoX's fused, head-interleaved query_key_value is not mapped (refused).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import numpy as np

from transformer.interop.hf import converter_for
from transformer.interop.tensors import unstack_layers
from transformer.spec import ConfigError, LoraSpec, MissingInputError, ModelConfig
from transformer.spec.lora import LORA_TARGETS

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's key prefix in adapter_model.safetensors
# Each projection: its LoRA target and how many of its kernel's leading axes are inputs (out: (N, H) -> D).
PROJECTIONS = {"query": ("query", 1), "key": ("key", 1), "value": ("value", 1), "out": ("out", 2),
               "wi": ("mlp_in", 1), "wi_gate": ("mlp_in", 1), "wi_up": ("mlp_in", 1), "wo": ("mlp_out", 1)}


@dataclasses.dataclass(frozen=True)
class Site:
    """A projection (`path`: its module path in the params tree, e.g. blocks/layers_0/attention/query) and the
    Hugging Face module holding it; `part` of `parts` equal slices of that module's output (GPT-2's c_attn)."""
    path: tuple[str, ...]
    module: str
    part: int = 0
    parts: int = 1

    @property
    def target(self) -> str:
        return PROJECTIONS[self.path[-1]][0]


def _block_sites(block: tuple[str, ...], attention: dict[str, str], mlp: dict[str, str]) -> list[Site]:
    return ([Site(block + (kind, proj), module) for (kind, proj), module in attention.items()]
            + [Site(block + ("mlp", proj), module) for proj, module in mlp.items()])


def sites(name: str, cfg: ModelConfig) -> list[Site]:
    """Every projection of the model in Hugging Face layout `name` (hf.CONVERTERS) with its module there."""
    mlp_in = (("wi_gate", "wi_up") if cfg.gated else ("wi",))
    out: list[Site] = []
    for i in range(cfg.num_layers):
        block = ("blocks", f"layers_{i}")
        if name == "gpt2":
            p = f"transformer.h.{i}."
            out += [Site(block + ("attention", proj), p + "attn.c_attn", part, 3)
                    for part, proj in enumerate(("query", "key", "value"))]
            out += _block_sites(block, {("attention", "out"): p + "attn.c_proj"},
                                {"wi": p + "mlp.c_fc", "wo": p + "mlp.c_proj"})
        elif name in ("llama", "qwen3"):
            p = f"model.layers.{i}."
            out += _block_sites(block, {("attention", o): p + f"self_attn.{h}_proj" for o, h in
                                        (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))},
                                {"wi_gate": p + "mlp.gate_proj", "wi_up": p + "mlp.up_proj", "wo": p + "mlp.down_proj"})
        elif name == "bert":
            p = f"bert.encoder.layer.{i}."
            out += _block_sites(("encoder",) + block,
                                {**{("attention", o): p + f"attention.self.{o}" for o in ("query", "key", "value")},
                                 ("attention", "out"): p + "attention.output.dense"},
                                {"wi": p + "intermediate.dense", "wo": p + "output.dense"})
    if name == "t5":
        hf_mlp = dict(zip(mlp_in, ("wi_0", "wi_1") if cfg.gated else ("wi",)), wo="wo")
        for stack, layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.num_layers)):
            for i in range(layers):
                block, p = (stack, "blocks", f"layers_{i}"), f"{stack}.block.{i}.layer."
                attention = {("attention", o): p + f"0.SelfAttention.{h}" for o, h in
                             (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))}
                if stack == "decoder":
                    attention.update({("cross_attention", o): p + f"1.EncDecAttention.{h}" for o, h in
                                      (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))})
                f = "2" if stack == "decoder" else "1"
                out += _block_sites(block, attention, {o: p + f"{f}.DenseReluDense.{h}" for o, h in hf_mlp.items()})
    if not out:
        raise ConfigError(f"LoRA adapters of a Hugging Face {name} model are not mapped to peft's format here "
                          f"(GPT-NeoX fuses query, key and value head by head); merge them instead "
                          f"(experiments.export --merge_lora)")
    return [s for s in out if s.path[-1] in mlp_in + ("query", "key", "value", "out", "wo")]


def _scale(name: str, cfg: ModelConfig, site: Site) -> float:
    """What the layout's export multiplies this projection's kernel by (T5's query: our 1/sqrt(H) folded in,
    hf_t5._query_scale), and so its adapter's B too."""
    if name == "t5" and site.path[-1] == "query":
        from transformer.interop.hf_t5 import _query_scale
        return _query_scale(cfg)
    return 1.0


def _layout(cfg: ModelConfig) -> str:
    name, _ = converter_for(cfg.replace(lora=LoraSpec()))  # the base's layout; ConfigError: none fits
    return name


def _node(params: dict, path: tuple[str, ...]) -> dict:
    for k in path:
        params = params[k]
    return params


def to_peft(cfg: ModelConfig, params: Any, out: str, *, base_model: str | None = None) -> dict[str, Any]:
    """Writes OUT/adapter_config.json and OUT/adapter_model.safetensors (float32) of the adapters in `params`
    (model.lora's); returns the adapter config. `base_model`: recorded as base_model_name_or_path."""
    if not cfg.lora.rank:
        raise ConfigError("this model has no LoRA adapters (model.lora.rank=0): nothing to write in peft's format")
    name = _layout(cfg)
    params = unstack_layers(params)
    modules: dict[str, list[Site]] = {}
    for site in sites(name, cfg):
        if cfg.lora.rank_of(site.target):
            modules.setdefault(site.module, []).append(site)
    r, tensors, rank_pattern, alpha_pattern = cfg.lora.rank, {}, {}, {}
    for module, group in modules.items():
        a_rows, b_blocks = [], []
        for site in group:
            node, fold = _node(params, site.path), _scale(name, cfg, site)
            a_rows.append(np.asarray(node["lora_a"], np.float32).reshape(-1, r).T)   # (r, in)
            b_blocks.append(np.asarray(node["lora_b"], np.float32).reshape(r, -1).T * fold)  # (out part, r)
        parts, R = group[0].parts, r * len(group)
        width = b_blocks[0].shape[0]
        b = np.zeros((width * parts, R), np.float32)
        for j, (site, block) in enumerate(zip(group, b_blocks)):
            b[site.part * width:(site.part + 1) * width, j * r:(j + 1) * r] = block
        tensors[f"{PREFIX}{module}.lora_A.weight"] = np.concatenate(a_rows, 0)
        tensors[f"{PREFIX}{module}.lora_B.weight"] = b
        if R != r:  # one fused module holding several targets: its rank and alpha keep alpha / rank
            rank_pattern[re.escape(module)] = R
            alpha_pattern[re.escape(module)] = float(cfg.lora.alpha) * R / r
    config = {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model, "r": r,
              "lora_alpha": float(cfg.lora.alpha), "lora_dropout": float(cfg.lora.dropout), "bias": "none",
              "target_modules": sorted(modules), "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
              "fan_in_fan_out": name == "gpt2", "init_lora_weights": True, "use_rslora": False, "use_dora": False,
              "modules_to_save": None, "inference_mode": True}
    from safetensors.numpy import save_file
    os.makedirs(out, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(out, WEIGHTS_FILE),
              metadata={"format": "pt"})
    with open(os.path.join(out, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return config


def _pattern_value(patterns: dict, module: str, default: float) -> float:
    """peft's rank_pattern / alpha_pattern lookup: the first key matching the end of the module's name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read_peft(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(adapter_config.json, the tensors of adapter_model.safetensors) of a peft LoRA directory; each unsupported
    option is one ConfigError naming it."""
    cfg_path, weights = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    for file in (cfg_path, weights):
        if not os.path.isfile(file):
            raise MissingInputError(f"{file} not found: {path} is not a peft adapter directory")
    with open(cfg_path) as f:
        config = json.load(f)
    if config.get("peft_type") != "LORA":
        raise ConfigError(f"{cfg_path}: peft_type={config.get('peft_type')!r}; only LORA adapters are read")
    for key, wrong in (("use_dora", bool(config.get("use_dora"))), ("bias", config.get("bias", "none") != "none"),
                       ("modules_to_save", bool(config.get("modules_to_save")))):
        if wrong:
            raise ConfigError(f"{cfg_path}: {key}={config[key]!r} is not supported (only LoRA's low-rank update is "
                              f"read: no DoRA, no trained biases, no modules saved whole)")
    from safetensors.numpy import load_file
    return config, {k: np.asarray(v, np.float32) for k, v in load_file(weights).items()}


def from_peft(path: str, cfg: ModelConfig, params: Any) -> tuple[ModelConfig, dict]:
    """(cfg with model.lora, params with adapters) from the peft directory PATH over a base model `cfg`, `params`
    (unadapted, unscanned: a converted Hugging Face checkpoint, or a run's). The adapted model computes what peft
    computes over that base."""
    config, tensors = read_peft(path)
    base = cfg.replace(lora=LoraSpec())
    name = _layout(base)
    params = unstack_layers({k: v for k, v in params.items()})
    found: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, float]] = {}  # path -> (a (r, in), b (out, r), s)
    used = set()
    for site in sites(name, base):
        key = f"{PREFIX}{site.module}.lora_"
        if key + "A.weight" not in tensors:
            continue
        a, b = tensors[key + "A.weight"], tensors[key + "B.weight"]
        used |= {key + "A.weight", key + "B.weight"}
        rank = int(_pattern_value(config.get("rank_pattern"), site.module, config.get("r", a.shape[0])))
        alpha = float(_pattern_value(config.get("alpha_pattern"), site.module, config.get("lora_alpha", rank)))
        scale = alpha / (np.sqrt(rank) if config.get("use_rslora") else rank)
        rows = b.shape[0] // site.parts
        b = b[site.part * rows:(site.part + 1) * rows]
        cols = np.flatnonzero(np.any(b != 0, axis=0)) if site.parts > 1 else np.arange(b.shape[1])
        if len(cols):
            found[site.path] = (a[cols], b[:, cols] / _scale(name, base, site), scale)
    left = sorted(set(tensors) - used)
    if left:
        raise ConfigError(f"{path}: tensors with no place in a Hugging Face {name} model's projections: "
                          f"{', '.join(left[:4])}{' ...' if len(left) > 4 else ''}")
    if not found:
        raise ConfigError(f"{path}: no LoRA adapter of a projection of this model")
    rank = max(a.shape[0] for a, _, _ in found.values())
    scale = next(iter(found.values()))[2]
    targets = [t for t in LORA_TARGETS if any(PROJECTIONS[p[-1]][0] == t for p in found)]
    spec = LoraSpec(rank=rank, alpha=scale * rank, dropout=float(config.get("lora_dropout", 0.0)),
                    targets=",".join(targets))
    adapted = cfg.replace(lora=spec, scan_layers=False)  # the parameters come back unstacked
    for site in sites(name, adapted):
        if not spec.rank_of(site.target):
            continue
        node = _node(params, site.path)
        kernel = np.asarray(node["kernel"])
        n_in = PROJECTIONS[site.path[-1]][1]
        a, b, s = found.get(site.path, (np.zeros((0, int(np.prod(kernel.shape[:n_in]))), np.float32),
                                       np.zeros((int(np.prod(kernel.shape[n_in:])), 0), np.float32), scale))
        a_full = np.zeros((rank, a.shape[1]), np.float32)
        b_full = np.zeros((b.shape[0], rank), np.float32)
        a_full[:a.shape[0]], b_full[:, :b.shape[1]] = a, b * (s / scale)  # this module's scale folded into B
        node["lora_a"] = a_full.T.reshape(*kernel.shape[:n_in], rank)
        node["lora_b"] = b_full.T.reshape(rank, *kernel.shape[n_in:])
    return adapted, params

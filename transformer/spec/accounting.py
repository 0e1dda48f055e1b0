"""Parameter and FLOP accounting from a ModelConfig alone (no model is built).

Legend: V vocabulary, D d_model, L layers (L_e encoder, L_d decoder layers), N query heads,
K key/value heads, H head dimension, F d_ff, T sequence length, C classes.

Parameters, per piece (b = 1 with cfg.use_bias, else 0):
  attention       D·N·H + 2·D·K·H + N·H·D                 + b·(N·H + 2·K·H + D)   + 2·H with qk_norm
                  (N and K per layer: model.pruned_heads removes query heads and the key/value heads left without
                  one, spec/pruning.py)
  feed-forward    plain 2·D·F, gated 3·D·F                  + b·(F + D) plain, b·(2F + D) gated
  norm            LayerNorm D + b·D (scale, bias); RMSNorm D
  block           attention + FFN + 2 norms (parallel_block: 1 norm); a cross-attention block adds
                  attention + 1 norm
  embedding       V·D token table; + max_len·D learned position table per stack; + R·N T5 relative
                  bias table per stack (positional=t5_relative, R = relative_num_buckets)
  head            untied: D·V (no bias); tied: 0
  final norm      one per stack with pre-LN; embedding_norm adds one per stack
  LoRA            (model.lora, rank r) r·(in + out) per targeted projection: query r·(D + N·H), key and value
                  r·(D + K·H) each, out r·(N·H + D), mlp_in r·(D + F) (gated: two), mlp_out r·(F + D); in every
                  attention layer (cross-attention too) and every feed-forward layer
Families: decoder = embedding + L blocks + final norm + head. encoder = the same with bidirectional
blocks, then either the BERT masked-LM head (transform D·D + b·D, a norm, the head, an output bias
b·V) or, when num_classes > 0, the BERT pooler D·D + b·D and a classifier D·C + b·C.
encoder_decoder = one token table shared by both stacks and the tied head, a learned position table
per stack (as BART), L_e self-attention blocks and L_d blocks with cross-attention, a final norm per
stack (pre-LN), one head.
`non_embedding` = total − token table − position tables (an untied head counts as non-embedding).
`trainable` = total, or under LoRA the adapters plus a classifying encoder's pooler and classifier (the rest is
frozen: spec/lora.py).

FLOPs per token of training (forward + backward = 3 × forward; a multiply-add is 2 FLOPs):
  six_n           6 · N_matmul, N_matmul = matmul weights of the blocks (attention and FFN kernels and their
                  LoRA adapters, no biases or norms) + V·D for the output head, tied or not (it is a matmul
                  either way); an encoder's masked-LM head adds its D·D transform
  with_attention  six_n + 12 · L · T · N · H   (N per layer, pruned heads removed; QKᵀ and AV: 2·T·N·H each per token forward, ×3; the
                  full T, not halved for causal masks — Hoffmann et al. 2022, App. F). encoder_decoder:
                  L counts encoder self-, decoder self- and cross-attention layers, each with T keys.
                  This is the count behind the loop's `flops`, the sweeps' budgets and the bench's `mfu`.
  with_attention_causal_half
                  six_n + 12 · (L − L_c/2) · T · N · H: the L_c causal self-attention layers (a decoder's,
                  an encoder_decoder's decoder stack) at half, as a causal kernel skips the masked half of
                  QKᵀ and AV (MaxText counts causal attention this way since its PR 1988). Reported beside
                  with_attention (the bench's `mfu_causal_half`), never in its place. Neither count lowers for
                  model.sliding_window.
  training        with_attention − 2 · (N_matmul − the adapters' weights) under LoRA (the backward pass computes no
                  gradient of a frozen weight), else with_attention: what a training step computes
A classifying encoder has no vocabulary head; its pooler and classifier (once per sequence) are left out.
"""
from __future__ import annotations

from transformer.spec import pruning
from transformer.spec.errors import ConfigError
from transformer.spec.model import ModelConfig


def _attention_params(cfg: ModelConfig, N: int, K: int) -> tuple[int, int]:
    """(matmul weights, other: biases and the qk_norm scales) of one attention layer of N query and K key/value
    heads (model.pruned_heads: per layer)."""
    D, H = cfg.d_model, cfg.dim_per_head
    weights = D * N * H + 2 * D * K * H + N * H * D
    biases = (N * H + 2 * K * H + D) if cfg.use_bias else 0
    return weights, biases + (2 * H if cfg.qk_norm else 0)


def _attention_lora(cfg: ModelConfig, N: int, K: int) -> int:
    """LoRA adapter parameters of one attention layer of N query and K key/value heads."""
    D, H = cfg.d_model, cfg.dim_per_head
    sizes = {"query": D + N * H, "key": D + K * H, "value": D + K * H, "out": N * H + D}
    return sum(cfg.lora.rank_of(name) * size for name, size in sizes.items())


def _ffn_lora(cfg: ModelConfig) -> int:
    """LoRA adapter parameters of one feed-forward layer."""
    D, F = cfg.d_model, cfg.d_ff
    return cfg.lora.rank_of("mlp_in") * (D + F) * (2 if cfg.gated else 1) + cfg.lora.rank_of("mlp_out") * (F + D)


def _ffn_params(cfg: ModelConfig) -> tuple[int, int]:
    """(matmul weights, biases) of one feed-forward layer."""
    D, F = cfg.d_model, cfg.d_ff
    if cfg.gated:
        return 3 * D * F, (2 * F + D) if cfg.use_bias else 0
    return 2 * D * F, (F + D) if cfg.use_bias else 0


def _norm_params(cfg: ModelConfig) -> int:
    D = cfg.d_model
    return 2 * D if (cfg.norm == "layernorm" and cfg.use_bias) else D


def _stacks(cfg: ModelConfig) -> list[tuple[int, bool]]:
    """(layers, has cross-attention) for each block stack of the family."""
    if cfg.family == "encoder_decoder":
        return [(cfg.encoder_layers, False), (cfg.num_layers, True)]
    return [(cfg.num_layers, False)]


def _heads(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(query heads, key/value heads) of every attention layer (self- and cross-attention), in call order."""
    return [pruning.layer_heads(cfg, path) for path in pruning.attention_paths(cfg)]


def lora_params(cfg: ModelConfig) -> int:
    """The LoRA adapters' parameters (0 without LoRA): the matmul weights a LoRA run trains."""
    blocks = sum(layers for layers, _ in _stacks(cfg))
    return sum(_attention_lora(cfg, N, K) for N, K in _heads(cfg)) + blocks * _ffn_lora(cfg)


def _matmul_and_other(cfg: ModelConfig) -> tuple[int, int]:
    """(matmul weights, other non-embedding params) of the blocks (LoRA adapters included), final norms and
    embedding norms."""
    ffn_w, ffn_b = _ffn_params(cfg)
    norm = _norm_params(cfg)
    matmul = other = 0
    for N, K in _heads(cfg):
        attn_w, attn_b = _attention_params(cfg, N, K)
        matmul += attn_w + _attention_lora(cfg, N, K)
        other += attn_b
    for layers, cross in _stacks(cfg):
        n_attn = 2 if cross else 1
        matmul += layers * (ffn_w + _ffn_lora(cfg))
        block_norms = 1 if cfg.parallel_block else n_attn + 1
        other += layers * (ffn_b + block_norms * norm)
        other += norm * (int(cfg.norm_position == "pre") + int(cfg.embedding_norm))
    return matmul, other


def _has_vocab_head(cfg: ModelConfig) -> bool:
    return not (cfg.family == "encoder" and cfg.num_classes)


def _encoder_head_params(cfg: ModelConfig) -> int:
    """An encoder's head besides the vocabulary projection: masked-LM transform, norm and output bias,
    or pooler and classifier."""
    D, b = cfg.d_model, int(cfg.use_bias)
    if cfg.num_classes:
        return D * D + b * D + D * cfg.num_classes + b * cfg.num_classes
    return D * D + b * D + _norm_params(cfg) + b * cfg.vocab_size


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """{"total", "non_embedding", "embedding", "trainable"} parameter counts of the model cfg builds."""
    V, D = cfg.vocab_size, cfg.d_model
    per_stack = {"learned": cfg.max_len * D, "t5_relative": cfg.relative_num_buckets * cfg.num_heads}
    embedding = V * D + len(_stacks(cfg)) * per_stack.get(cfg.positional, 0)
    matmul, other = _matmul_and_other(cfg)
    non_embedding = matmul + other + (0 if cfg.tie_embeddings or not _has_vocab_head(cfg) else D * V)
    if cfg.family == "encoder":
        non_embedding += _encoder_head_params(cfg)
    total = embedding + non_embedding
    trainable = total
    if cfg.lora.rank:  # the adapters, and a classifying encoder's head (spec.lora.TRAINED_MODULES)
        trainable = lora_params(cfg) + (_encoder_head_params(cfg) if cfg.family == "encoder" and cfg.num_classes
                                        else 0)
    return {"total": total, "non_embedding": non_embedding, "embedding": embedding, "trainable": trainable}


def matmul_params(cfg: ModelConfig) -> int:
    """N_matmul: the blocks' matmul weights plus the output head's V·D (tied or not) and, for a masked-LM
    encoder, its D·D transform."""
    if not _has_vocab_head(cfg):
        return _matmul_and_other(cfg)[0]
    mlm_transform = cfg.d_model * cfg.d_model if cfg.family == "encoder" else 0
    return _matmul_and_other(cfg)[0] + mlm_transform + cfg.vocab_size * cfg.d_model


def attention_layers(cfg: ModelConfig) -> int:
    """Attention layers each token goes through (self- and cross-attention alike)."""
    return sum(layers * (2 if cross else 1) for layers, cross in _stacks(cfg))


def causal_attention_layers(cfg: ModelConfig) -> int:
    """Causal self-attention layers each token goes through: a decoder's, an encoder_decoder's decoder stack."""
    return {"decoder": cfg.num_layers, "encoder_decoder": cfg.num_layers}.get(cfg.family, 0)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token: {"six_n": 6·N_matmul, "with_attention": six_n + 12·L·T·N·H,
    "with_attention_causal_half": six_n + 12·(L − L_c/2)·T·N·H, "training": with_attention less the frozen weights'
    gradients under LoRA (else with_attention)}; N per attention layer (model.pruned_heads)."""
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len} must be positive")
    n_matmul = matmul_params(cfg)
    six_n = 6.0 * n_matmul
    per_head = 12.0 * seq_len * cfg.dim_per_head
    paths, heads = pruning.attention_paths(cfg), _heads(cfg)
    attention = per_head * sum(N for N, _ in heads)
    causal = per_head * sum(N for p, (N, _) in zip(paths, heads)  # a decoder's self-attention
                            if cfg.family != "encoder" and not p.startswith("encoder/") and p.endswith("/attention"))
    frozen = n_matmul - lora_params(cfg) if cfg.lora.rank else 0
    return {"six_n": six_n, "with_attention": six_n + attention, "with_attention_causal_half": six_n + attention - causal / 2,
            "training": six_n + attention - 2.0 * frozen}


def train_flops(cfg: ModelConfig, seq_len: int, tokens: float, include_attention: bool = True) -> float:
    """FLOPs of training on `tokens` tokens: tokens × flops_per_token (with_attention, or six_n)."""
    per_token = flops_per_token(cfg, seq_len)
    return float(tokens) * per_token["with_attention" if include_attention else "six_n"]


VOCAB_MULTIPLE = 128


def padded_vocab_size(vocab_size: int) -> int:
    """The tokenizer's vocabulary rounded up to a multiple of 128, so the embedding and head split evenly
    over any power-of-two tensor axis and map well onto matmul units (as nanoGPT and MaxText do)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def padding_params(cfg: ModelConfig, vocab_size: int) -> int:
    """Parameters in the rows of cfg's vocabulary beyond the `vocab_size` ids a token can have (the padding up
    to a multiple of 128): each such id's row of the token table, its column of an untied output head, and its
    masked-LM output bias. summary.json's params_unpadded = params − this."""
    pad = cfg.vocab_size - vocab_size
    if pad < 0:
        raise ConfigError(f"vocab_size={vocab_size} exceeds the model's vocabulary ({cfg.vocab_size})")
    has_head = not (cfg.family == "encoder" and cfg.num_classes)
    untied_head = has_head and not cfg.tie_embeddings
    output_bias = cfg.family == "encoder" and not cfg.num_classes and cfg.use_bias
    return pad * (cfg.d_model * (1 + int(untied_head)) + int(output_bias))

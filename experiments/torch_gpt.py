"""A PyTorch eager GPT-2-shaped reference for `experiments/bench.py --compare_torch`.

Legend: B batch, T sequence, D model width, V vocabulary, N heads, H head dimension.

The same architecture as configs/lm.py's GPT-2 presets: learned positions, pre-LN LayerNorm, the
config's activation (relu, gelu, gelu_tanh), biases, tied head; causal attention through F.scaled_dot_product_attention; AdamW with the
same betas, eps, weight decay (on matrices and embeddings only) and gradient clipping (fused AdamW). It is a
timing reference, not part of the library.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, d_ff: int, eps: float, activation: str):
        super().__init__()
        self.n_heads, self.act = n_heads, ACTIVATIONS[activation]
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(self.ln1(x_BTD)).split(D, dim=-1)
        q_BNTH, k_BNTH, v_BNTH = (a.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for a in (q, k, v))
        a_BNTH = F.scaled_dot_product_attention(q_BNTH, k_BNTH, v_BNTH, is_causal=True)
        x_BTD = x_BTD + self.proj(a_BNTH.transpose(1, 2).reshape(B, T, D))
        return x_BTD + self.out(self.act(self.fc(self.ln2(x_BTD))))


class TorchGPT(nn.Module):
    """tokens_BT -> logits_BTV, tied head."""

    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, d_ff: int, max_len: int, eps: float,
                 activation: str):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList([Block(d, n_heads, d_ff, eps, activation) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d, eps=eps)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        x_BTD = self.tok(tokens_BT) + self.pos(torch.arange(tokens_BT.shape[1]))
        for block in self.blocks:
            x_BTD = block(x_BTD)
        return self.ln_f(x_BTD) @ self.tok.weight.T


def make_step(model_cfg: Any, train_cfg: Any, batch_size: int, seq_len: int,
              threads: int) -> tuple[Callable[[], float], TorchGPT]:
    """(a closure running one AdamW training step on a fixed random batch and returning its loss, the model).
    AdamW is torch's fused implementation (one kernel over all tensors, as optax's update is one XLA program),
    not the default per-tensor loop."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    c = model_cfg
    model = TorchGPT(c.vocab_size, c.d_model, c.num_layers, c.num_heads, c.d_ff, c.max_len, c.norm_eps, c.activation)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train_cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=train_cfg.learning_rate, betas=(train_cfg.b1, train_cfg.b2), eps=train_cfg.eps,
                            fused=True)
    tokens = torch.randint(0, c.vocab_size, (batch_size, seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        logits_BTV = model(inputs)
        loss = F.cross_entropy(logits_BTV.reshape(-1, c.vocab_size), targets.reshape(-1))
        loss.backward()
        if train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        opt.step()
        return loss.item()

    return step, model

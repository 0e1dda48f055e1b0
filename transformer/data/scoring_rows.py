"""Loglikelihood requests as token ids, packed into rows of one fixed shape (numpy only).

A request is (context ids, continuation ids): the loglikelihood of the continuation after the context. Text is
encoded as lm-evaluation-harness encodes it for a causal model (`encode_pair`): the context's trailing spaces
move into the continuation, the whole text is encoded and split at the context's length, and the context starts
with the tokenizer's bos (every training document began with it; the harness's prefix token for an empty context).

`pack` places requests into rows of T positions, several per row (best fit, longest first), each a segment of its
own (segment ids 1, 2, … in a row; positions restarting at 0; 0 = padding), as training rows are packed: the
model's segment mask keeps each request's attention inside it, so a packed request scores as it would alone.
A request longer than T + 1 tokens keeps its last T + 1 (lm-evaluation-harness's left truncation); a continuation
longer than T is refused. Shapes: R rows, T = the row length.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Sequence

import numpy as np

Request = tuple[Sequence[int], Sequence[int]]  # (context ids, bos first; continuation ids)


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int], str]:
    """(context ids with bos first, continuation ids, the continuation as scored: with the context's trailing
    spaces), lm-evaluation-harness's causal-model encoding (the module docstring)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    bos = [int(tokenizer.bos_id)]
    context_ids = bos + [int(i) for i in tokenizer.encode(context)] if context else bos
    whole = bos + [int(i) for i in tokenizer.encode(context + continuation)]
    return context_ids, whole[len(context_ids):], continuation


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Rows of the model's batch keys (inputs, targets, positions, segment_ids: int32 [R, T]; weights float32
    [R, T], 1 where a continuation token is scored) and `request_RT` (int32 [R, T]: which request a scored target
    belongs to, -1 elsewhere); `num_requests`; `truncated`: requests whose context was cut on the left."""
    inputs: np.ndarray
    targets: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    weights: np.ndarray
    request_RT: np.ndarray
    num_requests: int
    truncated: int

    def batch(self, start: int, size: int) -> dict[str, np.ndarray]:
        """Rows [start, start + size) as a model batch, all-padding rows appended past the last row."""
        out = {}
        for key in ("inputs", "targets", "positions", "segment_ids", "weights"):
            a = getattr(self, key)[start:start + size]
            out[key] = np.concatenate([a, np.zeros((size - len(a), a.shape[1]), a.dtype)]) if len(a) < size else a
        return out


def pack(requests: Sequence[Request], seq_len: int) -> PackedRows:
    """The requests in rows of `seq_len` positions (the module docstring). ValueError for an empty continuation,
    an empty context (it holds at least bos) or a continuation of more than seq_len tokens."""
    T = int(seq_len)
    lengths, truncated = [], 0
    for i, (ctx, cont) in enumerate(requests):
        if not len(ctx) or not len(cont):
            raise ValueError(f"request {i}: a context (bos at least) and a continuation of one token or more needed")
        if len(cont) > T:
            raise ValueError(f"request {i}: its continuation of {len(cont)} tokens is longer than the model's "
                             f"{T} positions")
        n = len(ctx) + len(cont) - 1  # the positions it takes: every token but the last is an input
        truncated += n > T
        lengths.append(min(n, T))
    order = sorted(range(len(requests)), key=lambda i: (-lengths[i], i))
    free: list[tuple[int, int]] = []  # (free positions, row), sorted: best fit is the first with enough room
    rows: list[list[int]] = []
    for i in order:
        j = bisect.bisect_left(free, (lengths[i], -1))
        if j == len(free):
            rows.append([])
            row, room = len(rows) - 1, T
        else:
            room, row = free.pop(j)
        rows[row].append(i)
        if room - lengths[i] > 0:
            bisect.insort(free, (room - lengths[i], row))
    R = len(rows)
    out = {k: np.zeros((R, T), np.int32) for k in ("inputs", "targets", "positions", "segment_ids")}
    weights, request_RT = np.zeros((R, T), np.float32), np.full((R, T), -1, np.int32)
    for r, members in enumerate(rows):
        at = 0
        for seg, i in enumerate(members, start=1):
            ctx, cont = requests[i]
            tokens = np.asarray([*ctx, *cont], np.int64)[-(lengths[i] + 1):]
            n = lengths[i]
            span = slice(at, at + n)
            out["inputs"][r, span], out["targets"][r, span] = tokens[:-1], tokens[1:]
            out["positions"][r, span], out["segment_ids"][r, span] = np.arange(n), seg
            scored = slice(at + n - len(cont), at + n)
            weights[r, scored], request_RT[r, scored] = 1.0, i
            at += n
    return PackedRows(**out, weights=weights, request_RT=request_RT, num_requests=len(requests),
                      truncated=int(truncated))


def reduce(rows: PackedRows, logprob_RT: np.ndarray, greedy_RT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(loglikelihood float64 [N], is_greedy bool [N]) of each request from the per-target log-probabilities and
    argmax matches of the rows (the scoring step's outputs, [R, T] each)."""
    scored = rows.request_RT >= 0
    ids = rows.request_RT[scored]
    ll = np.zeros(rows.num_requests, np.float64)
    np.add.at(ll, ids, np.asarray(logprob_RT, np.float64)[scored])
    misses = np.zeros(rows.num_requests, np.int64)
    np.add.at(misses, ids, ~np.asarray(greedy_RT, bool)[scored])
    return ll, misses == 0

"""Loglikelihood requests as token ids, packed into rows of one fixed shape (numpy only).

A request is (context ids, continuation ids): the loglikelihood of the continuation after the context. A `Layout`
says how requests become rows, by the model's family:
  decoder          text encoded as lm-evaluation-harness encodes it for a causal model (`encode_pair`): the
                   context's trailing spaces move into the continuation, the whole text is encoded and split at the
                   context's length, and the context starts with the tokenizer's bos (every training document began
                   with it; the harness's prefix token for an empty context). `pack`: rows of T positions holding
                   context and continuation, a request longer than T + 1 tokens keeping its last T + 1 (the
                   harness's left truncation).
  encoder–decoder  as the harness's seq2seq backend encodes (`encode_seq2seq_pair`): the spaces moved alike, the
                   context encoded alone and ended with eos (T5's tokenizer template; a span-corruption run's
                   encoder inputs end with it), the continuation encoded alone. `pack_seq2seq`: the context in an
                   encoder row of S positions (its last S tokens kept), the continuation in the decoder row of T
                   positions (decoder inputs: the decoder start, then the continuation but its last token).
Several requests share a row (best fit, longest first), each a segment of its own (segment ids 1, 2, … in a row;
positions restarting at 0; 0 = padding), as training rows are packed: the model's segment masks keep each
request's attention (and an encoder–decoder's cross-attention) inside it, so a packed request scores as it would
alone. A continuation longer than T is refused. Shapes: R rows, T the (decoder) row length, S the encoder's.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Sequence

import numpy as np

Request = tuple[Sequence[int], Sequence[int]]  # (context ids: bos first, or eos last; continuation ids)


def _spaces_moved(context: str, continuation: str) -> tuple[str, str]:
    """(context, continuation) with the context's trailing spaces moved to the continuation's start (the harness's
    rule for either family)."""
    n_spaces = len(context) - len(context.rstrip())
    return (context[:-n_spaces], context[-n_spaces:] + continuation) if n_spaces else (context, continuation)


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int], str]:
    """(context ids with bos first, continuation ids, the continuation as scored: with the context's trailing
    spaces), lm-evaluation-harness's causal-model encoding (the module docstring)."""
    context, continuation = _spaces_moved(context, continuation)
    bos = [int(tokenizer.bos_id)]
    context_ids = bos + [int(i) for i in tokenizer.encode(context)] if context else bos
    whole = bos + [int(i) for i in tokenizer.encode(context + continuation)]
    return context_ids, whole[len(context_ids):], continuation


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Rows of the model's batch keys (`features`: int32 [R, T] each — a decoder's inputs, targets, positions,
    segment_ids; an encoder–decoder's decoder_inputs, targets, target_positions, target_segment_ids and the encoder's
    inputs, input_positions, input_segment_ids of [R, S] — and float32 weights [R, T], 1 where a continuation token
    is scored), `request_RT` (int32 [R, T]: which request a scored target belongs to, -1 elsewhere);
    `num_requests`; `truncated`: requests whose context was cut on the left."""
    features: dict[str, np.ndarray]
    request_RT: np.ndarray
    num_requests: int
    truncated: int

    @property
    def num_rows(self) -> int:
        return len(self.request_RT)

    def batch(self, start: int, size: int) -> dict[str, np.ndarray]:
        """Rows [start, start + size) as a model batch, all-padding rows appended past the last row."""
        out = {}
        for key, a in self.features.items():
            a = a[start:start + size]
            out[key] = np.concatenate([a, np.zeros((size - len(a), a.shape[1]), a.dtype)]) if len(a) < size else a
        return out


def _check(requests: Sequence[Request], target_len: int) -> None:
    """ValueError for an empty continuation, an empty context or a continuation longer than the decoder's rows."""
    for i, (ctx, cont) in enumerate(requests):
        if not len(ctx) or not len(cont):
            raise ValueError(f"request {i}: a context (bos or eos at least) and a continuation of one token or more "
                             "needed")
        if len(cont) > target_len:
            raise ValueError(f"request {i}: its continuation of {len(cont)} tokens is longer than the model's "
                             f"{target_len} positions")


def _place(sizes: Sequence[tuple[int, int]], rooms: tuple[int, int]) -> list[list[int]]:
    """Items of (first, second) sizes into rows of `rooms`: best fit on the first room (longest first), the
    second room checked among the few best candidates; the items of each row in placing order."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i][0], -sizes[i][1], i))
    free: list[tuple[int, int, int]] = []  # (first room left, row, second room left), sorted
    rows: list[list[int]] = []
    for i in order:
        a, b = sizes[i]
        j = first = bisect.bisect_left(free, (a, -1, -1))
        while j < min(len(free), first + 8) and free[j][2] < b:
            j += 1
        if j == min(len(free), first + 8):
            rows.append([])
            row, room_a, room_b = len(rows) - 1, *rooms
        else:
            room_a, row, room_b = free.pop(j)
        rows[row].append(i)
        if room_a - a > 0 and room_b - b > 0:
            bisect.insort(free, (room_a - a, row, room_b - b))
    return rows


def pack(requests: Sequence[Request], seq_len: int) -> PackedRows:
    """A decoder's requests in rows of `seq_len` positions (the module docstring). ValueError for an empty
    continuation, an empty context (it holds at least bos) or a continuation of more than seq_len tokens."""
    T = int(seq_len)
    _check(requests, T)
    lengths = [min(len(ctx) + len(cont) - 1, T) for ctx, cont in requests]  # every token but the last is an input
    truncated = sum(len(ctx) + len(cont) - 1 > T for ctx, cont in requests)
    rows = _place([(n, 0) for n in lengths], (T, 1))
    R = len(rows)
    out = {k: np.zeros((R, T), np.int32) for k in ("inputs", "targets", "positions", "segment_ids")}
    weights, request_RT = np.zeros((R, T), np.float32), np.full((R, T), -1, np.int32)
    for r, members in enumerate(rows):
        at = 0
        for seg, i in enumerate(members, start=1):
            ctx, cont = requests[i]
            n = lengths[i]
            tokens = np.asarray([*ctx, *cont], np.int64)[-(n + 1):]
            span = slice(at, at + n)
            out["inputs"][r, span], out["targets"][r, span] = tokens[:-1], tokens[1:]
            out["positions"][r, span], out["segment_ids"][r, span] = np.arange(n), seg
            scored = slice(at + n - len(cont), at + n)
            weights[r, scored], request_RT[r, scored] = 1.0, i
            at += n
    return PackedRows({**out, "weights": weights}, request_RT, len(requests), int(truncated))


def encode_seq2seq_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int], str]:
    """(context ids ending with eos, continuation ids, the continuation as scored: with the context's trailing
    spaces), lm-evaluation-harness's encoder–decoder encoding (the module docstring)."""
    context, continuation = _spaces_moved(context, continuation)
    context_ids = [int(i) for i in tokenizer.encode(context)] + [int(tokenizer.eos_id)]
    return context_ids, [int(i) for i in tokenizer.encode(continuation)], continuation


def pack_seq2seq(requests: Sequence[Request], source_len: int, target_len: int, decoder_start: int) -> PackedRows:
    """An encoder–decoder's requests: contexts in encoder rows of `source_len` positions (the last ones kept),
    continuations in decoder rows of `target_len`, request k of a row segment k on both sides (the module
    docstring); `decoder_start` the decoder's first input. ValueError as `pack`."""
    S, T = int(source_len), int(target_len)
    _check(requests, T)
    sizes = [(min(len(ctx), S), len(cont)) for ctx, cont in requests]
    rows = _place(sizes, (S, T))
    R = len(rows)
    src = {k: np.zeros((R, S), np.int32) for k in ("inputs", "input_positions", "input_segment_ids")}
    tgt = {k: np.zeros((R, T), np.int32) for k in ("decoder_inputs", "targets", "target_positions",
                                                    "target_segment_ids")}
    weights, request_RT = np.zeros((R, T), np.float32), np.full((R, T), -1, np.int32)
    for r, members in enumerate(rows):
        at_s = at_t = 0
        for seg, i in enumerate(members, start=1):
            ctx, cont = requests[i]
            n, m = sizes[i]
            s_span, t_span = slice(at_s, at_s + n), slice(at_t, at_t + m)
            src["inputs"][r, s_span] = np.asarray(ctx, np.int64)[-n:]
            src["input_positions"][r, s_span], src["input_segment_ids"][r, s_span] = np.arange(n), seg
            tgt["decoder_inputs"][r, t_span] = [decoder_start, *cont[:-1]]
            tgt["targets"][r, t_span] = cont
            tgt["target_positions"][r, t_span], tgt["target_segment_ids"][r, t_span] = np.arange(m), seg
            weights[r, t_span], request_RT[r, t_span] = 1.0, i
            at_s, at_t = at_s + n, at_t + m
    truncated = sum(len(ctx) > S for ctx, _ in requests)
    return PackedRows({**src, **tgt, "weights": weights}, request_RT, len(requests), int(truncated))


class _MemoTokenizer:
    """A tokenizer's encode (int ids) remembered per text, with its bos_id and eos_id: Layout.encode_all's."""

    def __init__(self, tokenizer: Any):
        self._tokenizer, self._ids = tokenizer, {}
        self.bos_id, self.eos_id = tokenizer.bos_id, tokenizer.eos_id

    def encode(self, text: str) -> list[int]:
        ids = self._ids.get(text)
        if ids is None:
            ids = self._ids[text] = [int(i) for i in self._tokenizer.encode(text)]
        return ids


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a model's requests become rows (the module docstring): a decoder's rows of `target_len` positions, or,
    with `source_len` > 0, an encoder–decoder's encoder rows of `source_len` and decoder rows of `target_len`
    beginning with `decoder_start`."""
    target_len: int
    source_len: int = 0
    decoder_start: int = 0

    @property
    def seq2seq(self) -> bool:
        return self.source_len > 0

    def encode(self, tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int], str]:
        """encode_pair, or encode_seq2seq_pair for an encoder–decoder."""
        return (encode_seq2seq_pair if self.seq2seq else encode_pair)(tokenizer, context, continuation)

    def encode_all(self, tokenizer: Any, texts: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int], str]]:
        """`encode` of each (context, continuation), each distinct text tokenized once: the choices of a document
        share its context, which would otherwise be tokenized once per choice."""
        memo = _MemoTokenizer(tokenizer)
        return [self.encode(memo, c, x) for c, x in texts]

    def pack(self, requests: Sequence[Request]) -> PackedRows:
        """pack, or pack_seq2seq for an encoder–decoder."""
        if self.seq2seq:
            return pack_seq2seq(requests, self.source_len, self.target_len, self.decoder_start)
        return pack(requests, self.target_len)


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

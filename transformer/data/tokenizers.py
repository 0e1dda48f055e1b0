"""Tokenizers: raw UTF-8 bytes (the default) or a SentencePiece BPE model trained on the corpus.

Both reserve ids 0/1/2 for pad/bos/eos, so the packing and the loss treat them alike.
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

import ml_collections
import numpy as np
import sentencepiece as spm

from transformer.data import corpus
from transformer.models.config import ConfigError

TOKENIZERS = ("bytes", "sentencepiece")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SP_SAMPLE_BYTES = 8_000_000  # of train text fed to the SentencePiece trainer (~1 s on 2 CPU cores)
SP_SAMPLE_SEED = 0


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> int32 ids. `encode` adds no bos/eos; pad/bos/eos are 0/1/2."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str | bytes) -> np.ndarray: ...

    def decode(self, ids: Iterable[int] | np.ndarray) -> str: ...


class ByteTokenizer:
    """Each UTF-8 byte b is id b + 3; vocab 259. Decoding drops pad/bos/eos and replaces bad UTF-8."""

    vocab_size = 256 + 3
    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID
    _OFFSET = 3

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32) + self._OFFSET

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        ids_N = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        ids_N = ids_N[(ids_N >= self._OFFSET) & (ids_N < self.vocab_size)]
        return (ids_N - self._OFFSET).astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class SentencePieceTokenizer:
    """A SentencePiece model (pad/bos/eos = 0/1/2, byte fallback). Picklable for grain workers."""

    def __init__(self, model_proto: bytes):
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id()) != (PAD_ID, BOS_ID, EOS_ID):
            raise ConfigError("SentencePiece model must have pad/bos/eos ids 0/1/2, got "
                             f"{self._sp.pad_id()}/{self._sp.bos_id()}/{self._sp.eos_id()}")
        self.vocab_size = self._sp.vocab_size()
        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID

    @classmethod
    def from_file(cls, path: str) -> SentencePieceTokenizer:
        with open(path, "rb") as f:
            return cls(f.read())

    @property
    def model_proto(self) -> bytes:
        """The serialized model (what a `.model` file holds)."""
        return self._proto

    def encode(self, text: str | bytes) -> np.ndarray:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        return np.asarray(self._sp.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __getstate__(self) -> dict[str, bytes]:
        return {"proto": self._proto}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self.__init__(state["proto"])


def _lines(texts: Iterable[str | bytes]) -> Iterator[str]:
    for text in texts:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        yield from text.split("\n")


def train_sentencepiece(texts: Iterable[str | bytes], vocab_size: int) -> SentencePieceTokenizer:
    """Trains a BPE model with `vocab_size` pieces on `texts`, lossless on any text.

    Identity normalisation, no dummy prefix, whitespace kept (runs of spaces may become pieces),
    "\\n" a piece of its own, unknown characters as UTF-8 byte pieces.
    """
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_lines(texts), model_writer=model, vocab_size=vocab_size,
            model_type="bpe", byte_fallback=True, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=3,
            normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True, user_defined_symbols=["\n"], character_coverage=0.9995,
            num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        raise ConfigError(f"data.vocab_size={vocab_size} does not fit a SentencePiece model with byte "
                          f"fallback on this corpus (256 byte pieces + characters + merges): {e}") from e
    return SentencePieceTokenizer(model.getvalue())


def _corpus_sample(data_cfg: ml_collections.ConfigDict, max_bytes: int) -> Iterator[bytes]:
    """Train-split documents in a fixed pseudo-random order, until `max_bytes` have been yielded."""
    source = corpus.load_split(data_cfg, data_cfg.train_split)
    used = 0
    for i in np.random.default_rng(SP_SAMPLE_SEED).permutation(len(source)):
        if used >= max_bytes:
            return
        text = source[int(i)]["text"]
        used += len(text)
        yield text


def sentencepiece_path(data_cfg: ml_collections.ConfigDict) -> str:
    """Where the corpus's SentencePiece model is cached: keyed by dataset, split and vocab size."""
    name = f"{corpus.dataset_key(data_cfg)}_{data_cfg.train_split}_bpe{data_cfg.vocab_size}.model"
    return os.path.join(corpus.resolve_data_dir(data_cfg), "tokenizers", name.replace("/", "_"))


def get_tokenizer(data_cfg: ml_collections.ConfigDict) -> Tokenizer:
    """The tokenizer named by `data.tokenizer`; a SentencePiece model is trained once and cached."""
    if data_cfg.tokenizer == "bytes":
        return ByteTokenizer()
    if data_cfg.tokenizer == "sentencepiece":
        path = sentencepiece_path(data_cfg)
        with corpus.file_lock(path + ".lock"):
            if not os.path.exists(path):
                print(f"Training a {data_cfg.vocab_size}-piece SentencePiece model -> {path}", flush=True)
                tok = train_sentencepiece(_corpus_sample(data_cfg, SP_SAMPLE_BYTES), data_cfg.vocab_size)
                tmp = path + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(tok.model_proto)
                os.replace(tmp, path)
                return tok
        return SentencePieceTokenizer.from_file(path)
    raise ConfigError(f"data.tokenizer={data_cfg.tokenizer!r} is not valid; choose one of {', '.join(TOKENIZERS)}")

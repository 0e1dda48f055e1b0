"""Tokenizers: raw UTF-8 bytes (the default), a SentencePiece BPE model trained on the corpus, or a
file: a SentencePiece `.model` or a Hugging Face `tokenizer.json` (the `tokenizers` library).

Bytes and the trained model reserve ids 0/1/2 for pad/bos/eos; a file's tokenizer keeps its own
special ids (GPT-2's `<|endoftext|>` is both bos and eos). `byte_lengths()` gives each id's length in
UTF-8 bytes of text (0 for special ids), for bits per byte. Every tokenizer has a `fingerprint` (a hash
of what defines it); a run copies its tokenizer file into its workdir (`record_tokenizer`), so
sampling and resuming need nothing outside the workdir.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import sentencepiece as spm

from transformer import file_claims
from transformer.data import corpus, documents
from transformer.spec import ConfigError, DataSpec

TOKENIZERS = ("bytes", "sentencepiece", "a SentencePiece .model path", "a Hugging Face tokenizer.json path")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SP_SAMPLE_BYTES = 8_000_000  # of train text fed to the SentencePiece trainer (~1 s on 2 CPU cores)
SP_SAMPLE_SEED = 0


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> int32 ids. `encode` adds no bos/eos."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    fingerprint: str

    def encode(self, text: str | bytes) -> np.ndarray: ...

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...

    def decode(self, ids: Iterable[int] | np.ndarray) -> str: ...

    def byte_lengths(self) -> np.ndarray: ...


def _without_specials(lengths_V: np.ndarray, tokenizer: Tokenizer) -> np.ndarray:
    lengths_V[[tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id]] = 0
    return lengths_V


class ByteTokenizer:
    """Each UTF-8 byte b is id b + 3; vocab 259. Decoding drops pad/bos/eos and replaces bad UTF-8."""

    vocab_size = 256 + 3
    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID
    fingerprint = "bytes"
    _OFFSET = 3

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32) + self._OFFSET

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        ids_N = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        ids_N = ids_N[(ids_N >= self._OFFSET) & (ids_N < self.vocab_size)]
        return (ids_N - self._OFFSET).astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def byte_lengths(self) -> np.ndarray:
        """int64 [V]: 1 for each byte id, 0 for pad/bos/eos."""
        return _without_specials(np.ones(self.vocab_size, np.int64), self)


class SentencePieceTokenizer:
    """A SentencePiece model; bos/eos/pad are the model's own (a missing bos or pad falls back to eos).
    Picklable for grain workers."""

    def __init__(self, model_proto: bytes):
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if self._sp.eos_id() < 0:
            raise ConfigError("the SentencePiece model defines no eos piece (documents end with eos)")
        self.vocab_size = self._sp.vocab_size()
        self.eos_id = self._sp.eos_id()
        self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else self.eos_id
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id
        self.fingerprint = "sentencepiece:" + hashlib.sha256(model_proto).hexdigest()[:16]

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

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(texts, num_threads=os.cpu_count() or 1)]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        return self._sp.decode([int(i) for i in ids])

    def byte_lengths(self) -> np.ndarray:
        """int64 [V]: a byte-fallback piece 1, a text piece the UTF-8 length of its text ("▁" a space),
        control and unknown pieces 0. Exact for models without a dummy prefix (the trained ones); with
        one (LLaMA's), a document's first piece counts the space the model prepended."""
        sp, out = self._sp, np.zeros(self.vocab_size, np.int64)
        for i in range(self.vocab_size):
            if sp.is_byte(i):
                out[i] = 1
            elif not (sp.is_control(i) or sp.is_unknown(i)):
                out[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return _without_specials(out, self)

    def __getstate__(self) -> dict[str, bytes]:
        return {"proto": self._proto}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self.__init__(state["proto"])


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Special tokens a tokenizer.json may define, most specific first.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")
_PAD_NAMES = ("<pad>", "[PAD]", "<|padding|>", "<|pad|>")


def _first_id(vocab: dict[str, int], names: tuple[str, ...], default: int | None = None) -> int | None:
    return next((vocab[n] for n in names if n in vocab), default)


class HFTokenizer:
    """A Hugging Face `tokenizer.json` (the `tokenizers` library); `encode` adds no special tokens.

    eos is the first of _EOS_NAMES the vocabulary has; bos and pad fall back to eos (GPT-2 has only
    `<|endoftext|>`). Picklable for grain workers.
    """

    def __init__(self, json_text: str):
        import tokenizers as hf_tokenizers

        self._json = json_text
        self._tok = hf_tokenizers.Tokenizer.from_str(json_text)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        eos = _first_id(vocab, _EOS_NAMES)
        if eos is None:
            raise ValueError(f"the tokenizer defines no end-of-text token (one of {', '.join(_EOS_NAMES)})")
        self.eos_id = eos
        self.bos_id = _first_id(vocab, _BOS_NAMES, default=eos)
        self.pad_id = _first_id(vocab, _PAD_NAMES, default=eos)
        self.fingerprint = "tokenizer.json:" + hashlib.sha256(json_text.encode("utf-8")).hexdigest()[:16]

    @property
    def json_text(self) -> str:
        return self._json

    def encode(self, text: str | bytes) -> np.ndarray:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, np.int32) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def byte_lengths(self) -> np.ndarray:
        """int64 [V]: special tokens 0; with a byte-level decoder (GPT-2, LLaMA 3) each character of a token
        is one byte (exact); otherwise a `<0xNN>` byte-fallback token 1 and a text token the UTF-8 length of
        its text with "▁" as a space (SentencePiece-style; a dummy prefix counts as in SentencePiece)."""
        from tokenizers import pre_tokenizers

        spec = json.loads(self._json)
        byte_level = '"ByteLevel"' in json.dumps(spec.get("decoder"))
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        out = np.zeros(self.vocab_size, np.int64)
        for token, i in self._tok.get_vocab(with_added_tokens=True).items():
            if i in special:
                continue
            if byte_level and set(token) <= alphabet:
                out[i] = len(token)
            elif _BYTE_PIECE.fullmatch(token):
                out[i] = 1
            else:
                out[i] = len(token.replace("\u2581", " ").encode("utf-8"))
        return _without_specials(out, self)

    def __getstate__(self) -> dict[str, str]:
        return {"json": self._json}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["json"])


def special_ids(tokenizer: Tokenizer) -> np.ndarray:
    """int64 [S], sorted: the ids that stand for no text (pad, bos, eos; a tokenizer.json's special tokens;
    SentencePiece control and unknown pieces). Bytes and the trained models: 0, 1, 2 (and unk 3 for the
    latter); a file's tokenizer: wherever it put them."""
    ids = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}
    if isinstance(tokenizer, SentencePieceTokenizer):
        sp = tokenizer._sp
        ids |= {i for i in range(tokenizer.vocab_size) if sp.is_control(i) or sp.is_unknown(i)}
    elif isinstance(tokenizer, HFTokenizer):
        ids |= {t["id"] for t in json.loads(tokenizer.json_text).get("added_tokens", []) if t.get("special")}
    return np.asarray(sorted(ids), np.int64)


def load_tokenizer_file(path: str, setting: str = "data.tokenizer") -> Tokenizer:
    """A SentencePiece `.model` or a Hugging Face `tokenizer.json` (or a folder holding one)."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full) and os.path.isfile(os.path.join(full, "tokenizer.json")):
        full = os.path.join(full, "tokenizer.json")
    if not os.path.isfile(full):
        raise ConfigError(f"{setting}={path!r}: no such file; choose one of {', '.join(TOKENIZERS)}")
    with open(full, "rb") as f:
        data = f.read()
    if full.endswith(".json"):
        try:
            return HFTokenizer(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises a plain Exception for a malformed file
            raise ConfigError(f"{setting}={path!r} is not a Hugging Face tokenizer.json: {e}") from None
    try:
        return SentencePieceTokenizer(data)
    except Exception as e:  # sentencepiece raises RuntimeError for a file that is not a model
        raise ConfigError(f"{setting}={path!r} is not a SentencePiece model (nor a tokenizer.json): {e}") from None


RECORDED_NAMES = ("tokenizer.model", "tokenizer.json")  # a run's copy of its tokenizer, in its workdir


def record_tokenizer(tokenizer: Tokenizer, workdir: str) -> None:
    """Copies a file-backed tokenizer into `workdir` (tokenizer.model / tokenizer.json); bytes needs none."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        name, data = "tokenizer.model", tokenizer.model_proto
    elif isinstance(tokenizer, HFTokenizer):
        name, data = "tokenizer.json", tokenizer.json_text.encode("utf-8")
    else:
        return
    path = os.path.join(workdir, name)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _recorded(data_cfg: DataSpec, workdir: str, training: bool) -> Tokenizer | None:
    """The tokenizer a run in `workdir` recorded, if it matches `data.tokenizer`'s kind and fingerprint
    (`training`: and the data.tokenizer file, where it still exists, holds the same tokenizer)."""
    kind = str(data_cfg.tokenizer)
    name = "tokenizer.json" if kind.endswith(".json") or os.path.isdir(os.path.expanduser(kind)) else "tokenizer.model"
    path = os.path.join(workdir, name)
    if kind == "bytes" or not os.path.isfile(path):
        return None
    tok = load_tokenizer_file(path, setting=f"the run's recorded tokenizer {path}")
    expected = data_cfg.get("tokenizer_fingerprint", None)
    if expected and tok.fingerprint != expected:
        raise ConfigError(f"{path} has fingerprint {tok.fingerprint}, but {workdir}/config.json records "
                          f"data.tokenizer_fingerprint={expected}")
    if training and kind != "sentencepiece" and os.path.exists(os.path.expanduser(kind)):  # the run's first file
        configured = load_tokenizer_file(kind)
        if configured.fingerprint != tok.fingerprint:
            raise ConfigError(f"data.tokenizer={kind!r} is another tokenizer ({configured.fingerprint}) than the one "
                              f"the run in {workdir} was trained with ({tok.fingerprint}, its copy {path}): resuming "
                              f"would tokenize new data with it; point data.tokenizer at {path}, or use a new workdir")
    return tok


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


def _corpus_sample(data_cfg: DataSpec, max_bytes: int) -> Iterator[bytes]:
    """Train-split documents in a fixed pseudo-random order (local files: in file order), until
    `max_bytes` have been yielded."""
    if DataSpec.of(data_cfg).uses_files:
        used = 0
        for text in documents.iter_split(data_cfg, "train"):
            if used >= max_bytes:
                return
            data = text.encode("utf-8", errors="replace")
            used += len(data)
            yield data
        return
    source = corpus.load_split(data_cfg, data_cfg.train_split)
    used = 0
    for i in np.random.default_rng(SP_SAMPLE_SEED).permutation(len(source)):
        if used >= max_bytes:
            return
        text = source[int(i)]["text"]
        used += len(text)
        yield text


def sentencepiece_path(data_cfg: DataSpec) -> str:
    """Where the corpus's SentencePiece model is cached: keyed by dataset, split and vocab size (local files: by
    their content-addressed fingerprint, the data identity's `source`, under data.cache_dir: a touched file or a
    copy of the corpus in another folder finds the same model)."""
    data_cfg = DataSpec.of(data_cfg)
    if data_cfg.uses_files:
        key = documents.files_fingerprint(data_cfg).removeprefix(documents.FINGERPRINT_PREFIX)
        return os.path.join(documents.cache_dir(data_cfg), "tokenizers", f"files-{key}_bpe{data_cfg.vocab_size}.model")
    name = f"{corpus.dataset_key(data_cfg)}_{data_cfg.train_split}_bpe{data_cfg.vocab_size}.model"
    return os.path.join(corpus.resolve_data_dir(data_cfg), "tokenizers", name.replace("/", "_"))


def _train_and_save(data_cfg: DataSpec, path: str) -> SentencePieceTokenizer:
    """Trains the corpus's SentencePiece model and writes it to `path` (a temporary name renamed into place)."""
    print(f"Training a {data_cfg.vocab_size}-piece SentencePiece model -> {path}", flush=True)
    tok = train_sentencepiece(_corpus_sample(data_cfg, SP_SAMPLE_BYTES), data_cfg.vocab_size)
    for name in glob.glob(glob.escape(path) + ".tmp-*"):  # a killed trainer's: we hold the model's build claim
        with contextlib.suppress(OSError):
            os.remove(name)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(tok.model_proto)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return tok


def get_tokenizer(data_cfg: DataSpec, workdir: str | None = None, training: bool = False) -> Tokenizer:
    """The tokenizer named by `data.tokenizer`; a SentencePiece model is trained once and cached.

    `workdir`: a run directory; the tokenizer the run recorded there (`record_tokenizer`) is used when
    present, so a run needs nothing outside its workdir (a moved tokenizer file is not needed). `training`
    (a run that trains on): a data.tokenizer file that holds another tokenizer than the recorded one is a
    ConfigError (sampling and export read the recorded copy whatever the file holds now).
    """
    if workdir is not None and (recorded := _recorded(data_cfg, workdir, training)) is not None:
        return recorded
    if data_cfg.tokenizer == "bytes":
        return ByteTokenizer()
    if data_cfg.tokenizer == "sentencepiece":
        path = sentencepiece_path(data_cfg)
        trained = file_claims.build_once(lambda: os.path.exists(path), path + ".building",
                                         lambda: _train_and_save(data_cfg, path),
                                         waiting=f"waiting for another process to train the SentencePiece model "
                                                 f"{path} (claim {path}.building)")
        if trained is not None:
            return trained
        return SentencePieceTokenizer.from_file(path)
    if not str(data_cfg.tokenizer).strip():
        raise ConfigError(f"data.tokenizer is empty; choose one of {', '.join(TOKENIZERS)}")
    return load_tokenizer_file(str(data_cfg.tokenizer))

"""Tokenize once: documents (local files or a TFDS dataset, sources.py) -> a cache of flat token arrays,
keyed by the documents and the tokenizer.

Layout of `<root>/tokens/<key>/` (root: sources.cache_root; key = cache_key of the data identity's source and
tokenizer fingerprints (identity.py), so a changed file, dataset or tokenizer makes a new cache, never a stale
one, and a touched file or a copy of the corpus in another folder finds the same one), for each split of
sources.CACHE_SPLITS ("train", "eval"):
  {split}.tokens   raw uint16 (vocab <= 65536) or uint32: every document as bos + ids + eos, concatenated
  {split}.offsets.npy  int64 [D + 1]: document d is tokens[offsets[d]:offsets[d + 1]]
  meta.json        counts (documents, tokens, UTF-8 bytes), dtype, fingerprints, tokenize rate,
                   eval_train_overlap_documents: eval documents whose tokens (SHA-1) are also a train document's
                   (explicit data.eval_files with any is a ConfigError; summary.json reports the count), and
                   `manifest`: {file name: {"bytes": size, "sha256": digest}} of the four files above
A named evaluation set (data/eval_sets.py) is a cache of one split, "eval" (meta.json's `splits`: ensure_split_cache).
The cache is written into a temporary directory and renamed into place when complete, so a cache
left half-written by a killed process is never read (and a directory without meta.json is rebuilt); the next
build of that cache (it holds the build claim) removes the killed builder's temporary directory.

A built cache is checked when a run opens it (`verify`; ensure_cache): meta.json's fingerprints must give the
directory's key, and each file its recorded size (always: a stat) and digest (once per process per cache, or on
request: experiments.prepare_data --verify). A damaged cache is refused with one error naming the file and saying
to delete the cache to rebuild it, never read. A cache built before the manifest (no `manifest` in meta.json) is
checked by the sizes its counts imply (tokens × dtype bytes, D + 1 offsets): truncated or missing files are found,
flipped bytes are not; an explicit verification of it is refused (it has no digests: delete it to rebuild).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np
import tqdm

from transformer import file_claims
from transformer.data import sources, tokenizers
from transformer.data.tokenizers import Tokenizer
from transformer.spec import ConfigError, DataSpec, MissingInputError

SPLITS = sources.CACHE_SPLITS
OVERLAP_KEY = "eval_train_overlap_documents"  # meta.json and summary.json: eval documents also in train
SPLITS_KEY = "splits"  # meta.json of a cache of other splits than SPLITS (ensure_split_cache)
_BATCH_BYTES = 1 << 22  # text handed to the tokenizer at once (its batch encoders run in parallel)


@dataclasses.dataclass(frozen=True)
class TokenSplit:
    """One split of a cache: tokens [N] (a read-only memmap) and offsets [D + 1]."""
    tokens: np.ndarray
    offsets: np.ndarray
    num_bytes: int


def cache_key(source_fingerprint: str, tokenizer_fingerprint: str) -> str:
    """The cache directory's name: a hash of the documents' and the tokenizer's fingerprints."""
    return hashlib.sha256(f"{source_fingerprint}|{tokenizer_fingerprint}".encode()).hexdigest()[:24]


def cache_path(data_cfg: DataSpec, tokenizer: Tokenizer, source_fingerprint: str | None = None) -> str:
    """Where the cache of (documents, tokenizer) lives; `source_fingerprint`: sources.fingerprint(data_cfg) when
    the caller has it (identity.RunData: computed once per run)."""
    source = source_fingerprint if source_fingerprint is not None else sources.fingerprint(data_cfg)
    return os.path.join(sources.cache_root(data_cfg), "tokens", cache_key(source, tokenizer.fingerprint))


def _check_writable(root: str) -> None:
    try:
        os.makedirs(root, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as e:
        raise ConfigError(f"data.cache_dir: cannot write the token cache in {root} ({e.strerror or e}); "
                          "set data.cache_dir to a writable directory") from None


def _batches(texts: Iterator[str]) -> Iterator[list[str]]:
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def document_hash(doc_tokens: np.ndarray) -> int:
    """A document's identity for the eval/train overlap check: the first 8 bytes of the SHA-1 of its cached
    tokens (bos + ids + eos; one tokenizer maps one text to one token sequence)."""
    return int.from_bytes(hashlib.sha1(np.ascontiguousarray(doc_tokens).tobytes()).digest()[:8], "big")


def split_hashes(split: TokenSplit) -> np.ndarray:
    """uint64 [D]: document_hash of each document of a built split."""
    o = split.offsets
    return np.asarray([document_hash(split.tokens[o[d]:o[d + 1]]) for d in range(len(o) - 1)], np.uint64)


def _overlap(hashes: dict[str, np.ndarray]) -> int:
    return int(np.isin(hashes["eval"], hashes["train"]).sum())


def _tokenize_split(texts: Iterator[str], empty_error: Callable[[], Exception], tokenizer: Tokenizer, split: str,
                    out_dir: str, dtype: np.dtype, verbose: bool) -> tuple[dict, np.ndarray, dict]:
    """Streams the split's documents (`texts`) through the tokenizer into out_dir/{split}.tokens; returns its
    counts, each document's hash (uint64 [D], document_hash) and the manifest entries of its two files.
    `empty_error()`: the error for a split without a document."""
    offsets, num_tokens, num_bytes, hashes, digest = [0], 0, 0, [], hashlib.sha256()
    bos, eos = np.array([tokenizer.bos_id], dtype), np.array([tokenizer.eos_id], dtype)
    start = time.perf_counter()
    # the bar is closed (its line ended) before an error propagates, so the error starts on a line of its own
    with tqdm.tqdm(desc=f"tokenizing {split}", unit="tok", unit_scale=True, disable=not verbose,
                   mininterval=1.0) as bar, open(os.path.join(out_dir, f"{split}.tokens"), "wb") as f:
        for batch in _batches(texts):
            for ids in tokenizer.encode_batch(batch):
                if len(ids) and int(ids.max()) >= tokenizer.vocab_size:
                    raise ValueError(f"tokenizer produced id {int(ids.max())} >= its vocab_size {tokenizer.vocab_size}")
                doc = np.concatenate([bos, ids.astype(dtype), eos])
                data = doc.tobytes()
                f.write(data)
                digest.update(data)
                hashes.append(document_hash(doc))
                num_tokens += len(doc)
                offsets.append(num_tokens)
            num_bytes += sum(len(t.encode("utf-8", errors="replace")) for t in batch)
            bar.update(num_tokens - bar.n)
    seconds = time.perf_counter() - start
    if len(offsets) == 1:
        raise empty_error()
    np.save(os.path.join(out_dir, f"{split}.offsets.npy"), np.asarray(offsets, np.int64))
    manifest = {f"{split}.tokens": {"bytes": num_tokens * dtype.itemsize, "sha256": digest.hexdigest()},
                f"{split}.offsets.npy": _file_entry(os.path.join(out_dir, f"{split}.offsets.npy"))}
    if verbose:
        print(f"tokenized {split}: {len(offsets) - 1} documents, {num_tokens} tokens, {num_bytes} bytes in "
              f"{seconds:.1f} s ({num_tokens / max(seconds, 1e-9):,.0f} tokens/s)", flush=True)
    return ({"documents": len(offsets) - 1, "tokens": num_tokens, "bytes": num_bytes,
             "seconds": seconds, "tokens_per_second": num_tokens / max(seconds, 1e-9)}, np.asarray(hashes, np.uint64),
            manifest)


def _check_overlap(data_cfg: DataSpec, overlap: int, eval_documents: int) -> None:
    """Explicit data.eval_files must hold no document of data.files (a held-out document is in one split by
    construction; two TFDS splits may share a few duplicates, which the summary reports)."""
    if overlap and DataSpec.of(data_cfg).has_eval_files:
        raise ConfigError(f"data.eval_files: {overlap} of its {eval_documents} documents are also documents of "
                          f"data.files (same text): evaluation would be on training data; remove them from one "
                          f"side, or leave data.eval_files empty to hold out data.eval_fraction of data.files")


CLAIM_STALE_S = 300.0  # a build claim not refreshed for this long is its builder's death: another takes over
_CLAIM_REFRESH_S = 30.0
_CLAIM_POLL_S = 2.0


def ensure_cache(data_cfg: DataSpec, tokenizer: Tokenizer, verbose: bool = True,
                 source_fingerprint: str | None = None) -> str:
    """The cache directory for (files, tokenizer), built on first use; safe across processes and hosts on a
    shared file system without file locks: one process claims the build (`<cache>.building`, a claim of
    file_claims.build_once), the others wait for its meta.json (or take a dead claim over); the build is written
    into a temporary directory renamed into place when complete, and a rename that finds the cache already
    there (a racing builder won) keeps that one. A cache that was there is checked (`verify`: its sizes, and its
    digests the first time this process opens it). `source_fingerprint`: as cache_path."""
    source = source_fingerprint if source_fingerprint is not None else sources.fingerprint(data_cfg)
    splits = {split: (functools.partial(sources.texts, data_cfg, split),
                      functools.partial(sources.empty_split_error, data_cfg, split)) for split in SPLITS}
    return _ensure(cache_path(data_cfg, tokenizer, source), tokenizer, source, splits, verbose,
                   functools.partial(_check_overlap, data_cfg))


def ensure_split_cache(root: str, source: str, tokenizer: Tokenizer, texts: Callable[[], Iterator[str]],
                       empty_error: Callable[[], Exception], verbose: bool = True, split: str = "eval") -> str:
    """A cache of one split (`split`, its documents `texts()`) under `root`/tokens/, keyed by (`source`, the
    tokenizer), built and checked as ensure_cache's (data/eval_sets.py: a named evaluation set)."""
    path = os.path.join(root, "tokens", cache_key(source, tokenizer.fingerprint))
    return _ensure(path, tokenizer, source, {split: (texts, empty_error)}, verbose, None)


Splits = dict[str, tuple[Callable[[], Iterator[str]], Callable[[], Exception]]]  # split -> (its texts, empty error)


def _ensure(path: str, tokenizer: Tokenizer, source: str, splits: Splits, verbose: bool,
            check_overlap: Callable[[int, int], None] | None) -> str:
    meta_path = os.path.join(path, "meta.json")
    if os.path.isfile(meta_path):
        verify(path)
        return path
    _check_writable(os.path.dirname(path))
    claim = path + ".building"
    file_claims.build_once(lambda: os.path.isfile(meta_path), claim,
                           lambda: _build(tokenizer, source, path, splits, verbose, check_overlap),
                           stale_after_s=CLAIM_STALE_S, heartbeat_s=_CLAIM_REFRESH_S, poll_s=_CLAIM_POLL_S,
                           waiting=f"waiting for another process to build the token cache {path} (claim {claim})"
                           if verbose else None)
    return path


_TMP = re.compile(r"^\.(?P<key>[0-9a-f]+)\.tmp-")  # a build's temporary directory: .<key>.tmp-<random suffix>


def remove_dead_builds(root: str, key: str) -> list[str]:
    """Removes the temporary directories under `root` (a tokens/ folder) that no live build will finish: those of
    `key`, whose build claim the caller holds (a builder that lost it was killed, or stalled for CLAIM_STALE_S),
    and those of any other key whose claim (`<key>.building`) is not live (file_claims.is_live). A live build made
    its claim before its directory, so it is never among them. Returns the removed paths."""
    removed = []
    for name in sorted(os.listdir(root)):
        found = _TMP.match(name)
        if not found or not os.path.isdir(os.path.join(root, name)):
            continue
        if found["key"] != key and file_claims.is_live(os.path.join(root, found["key"] + ".building"),
                                                       CLAIM_STALE_S):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)  # another user's, on a shared cache: may stay
        if not os.path.exists(os.path.join(root, name)):
            removed.append(os.path.join(root, name))
    return removed


def _build(tokenizer: Tokenizer, source: str, path: str, splits: Splits, verbose: bool,
           check_overlap: Callable[[int, int], None] | None) -> None:
    """Tokenizes every split into a temporary directory renamed to `path` (under the caller's build claim); with
    both SPLITS, the eval documents also in train are counted (`check_overlap(count, eval documents)` may refuse
    them); a cache of other splits records its `splits`."""
    root = os.path.dirname(path)
    if os.path.isdir(path):  # not written by ensure_cache (no meta.json): never trust it
        shutil.rmtree(path)
    for gone in remove_dead_builds(root, os.path.basename(path)):
        if verbose:
            print(f"removed {gone}: the temporary directory of a build that was killed", flush=True)
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=root)
    try:
        meta = {"source_fingerprint": source,
                "tokenizer_fingerprint": tokenizer.fingerprint, "dtype": dtype.name,
                "vocab_size": tokenizer.vocab_size, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
                MANIFEST_KEY: {}}
        hashes = {}
        for split, (texts, empty_error) in splits.items():
            meta[split], hashes[split], files = _tokenize_split(texts(), empty_error, tokenizer, split, tmp, dtype,
                                                                verbose)
            meta[MANIFEST_KEY].update(files)
        if tuple(splits) != SPLITS:
            meta[SPLITS_KEY] = list(splits)
        else:
            overlap = _overlap(hashes)
            if check_overlap is not None:
                check_overlap(overlap, len(hashes["eval"]))
            meta[OVERLAP_KEY] = overlap
            if overlap and verbose:
                print(f"warning: {overlap} of the {len(hashes['eval'])} eval documents are also train documents "
                      f"(same text)", flush=True)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the cache from the other users of a shared one
        try:
            os.rename(tmp, path)
            _VERIFIED.add(path)  # built by this process: its digests are those it just recorded
        except OSError:  # ENOTEMPTY / EEXIST: a builder that took over a stale claim finished first
            if not os.path.isfile(os.path.join(path, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; a failed build leaves nothing
    if verbose:
        print(f"token cache: {path}", flush=True)


def open_split(path: str, split: str) -> TokenSplit:
    """One split of a built cache, memory-mapped; its files' sizes checked (verify, without digests: a grain
    worker opens it too)."""
    meta = verify(path, digests=False)
    tokens = np.memmap(os.path.join(path, f"{split}.tokens"), dtype=np.dtype(meta["dtype"]), mode="r")
    offsets = np.load(os.path.join(path, f"{split}.offsets.npy"))
    if len(tokens) != int(offsets[-1]) or len(offsets) != int(meta[split]["documents"]) + 1:
        raise _damaged(path, f"{split}.offsets.npy", f"ends at token {int(offsets[-1])} of {len(offsets) - 1} "
                       f"documents, {split}.tokens holds {len(tokens)} of {meta[split]['documents']}")
    return TokenSplit(tokens, offsets, int(meta[split]["bytes"]))


def overlap_documents(path: str) -> int:
    """Eval documents whose tokens (so text) are also a train document's, from the cache's meta; a cache
    built before the count was recorded gets it now (computed from its tokens, added to its meta.json)."""
    meta = read_meta(path)
    if OVERLAP_KEY in meta:
        return int(meta[OVERLAP_KEY])
    meta[OVERLAP_KEY] = _overlap({s: split_hashes(open_split(path, s)) for s in SPLITS})
    try:  # an atomic replace: concurrent writers write the same content, a reader sees one whole file
        tmp = os.path.join(path, f"meta.json.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=2)
        os.replace(tmp, os.path.join(path, "meta.json"))
    except OSError:  # a read-only cache: the count is computed again next time
        pass
    return int(meta[OVERLAP_KEY])


def read_meta(path: str) -> dict:
    """The cache's meta.json; a missing or unreadable one is an error naming it (delete the cache to rebuild)."""
    meta_path = os.path.join(path, "meta.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise MissingInputError(f"the token cache {path} has no meta.json: delete it to rebuild "
                                f"(rm -r {path})") from None
    except (OSError, ValueError) as e:
        raise _damaged(path, "meta.json", f"cannot be read ({e})") from None
    if not isinstance(meta, dict) or any(k not in meta for k in ("dtype", *meta.get(SPLITS_KEY, SPLITS))):
        raise _damaged(path, "meta.json", "lacks the cache's dtype or split counts")
    return meta


MANIFEST_KEY = "manifest"  # meta.json: {file name: {"bytes": size, "sha256": digest}}
_VERIFIED: set[str] = set()  # caches whose digests this process checked (or built)
_HASH_CHUNK = 1 << 22


def _file_entry(path: str) -> dict:
    """{"bytes": size, "sha256": digest} of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return {"bytes": os.path.getsize(path), "sha256": h.hexdigest()}


def _damaged(path: str, name: str, what: str) -> ConfigError:
    return ConfigError(f"the token cache {path} is damaged: {name} {what}; delete it to rebuild (rm -r {path}), "
                       f"or run experiments.prepare_data --verify to check it")


def _expected_sizes(meta: dict) -> dict[str, int]:
    """The file sizes a cache's counts imply (a cache built before the manifest): tokens × dtype bytes, and the
    .npy of D + 1 int64 offsets (header included)."""
    sizes = {}
    for split in SPLITS:
        sizes[f"{split}.tokens"] = int(meta[split]["tokens"]) * np.dtype(meta["dtype"]).itemsize
        header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.int64))
        header["shape"] = (int(meta[split]["documents"]) + 1,)
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, header)
        sizes[f"{split}.offsets.npy"] = buffer.tell() + 8 * header["shape"][0]
    return sizes


def verify(path: str, digests: bool | None = None) -> dict:
    """Checks the built cache at `path` (the module docstring) and returns its meta. `digests`: True checks every
    file's SHA-256, False only sizes, None (the default) digests the first time this process checks `path`.
    MissingInputError for a missing file, ConfigError for another damage, each naming the file and saying to
    delete the cache to rebuild it; a cache without digests (built before the manifest) asked for them
    (`digests=True`) is a ConfigError too."""
    meta = read_meta(path)
    source, tokenizer = meta.get("source_fingerprint"), meta.get("tokenizer_fingerprint")
    if not isinstance(source, str) or not isinstance(tokenizer, str) or (
            cache_key(source, tokenizer) != os.path.basename(os.path.normpath(path))):
        raise _damaged(path, "meta.json", f"records the fingerprints of another cache ({source}, {tokenizer}), "
                       f"not of {os.path.basename(path)}")
    manifest = meta.get(MANIFEST_KEY)
    if digests and not manifest:
        raise ConfigError(f"the token cache {path} records no digests of its files (it was built before caches "
                          f"recorded them): its content cannot be verified; delete it to rebuild (rm -r {path})")
    check_digests = bool(manifest) and (digests or (digests is None and path not in _VERIFIED))
    expected = ({name: entry["bytes"] for name, entry in manifest.items()} if manifest else _expected_sizes(meta))
    for name, size in sorted(expected.items()):
        file = os.path.join(path, name)
        try:
            found = os.path.getsize(file)
        except FileNotFoundError:
            raise MissingInputError(f"the token cache {path} is damaged: {name} is missing; delete it to rebuild "
                                    f"(rm -r {path})") from None
        if found != size:
            raise _damaged(path, name, f"is {found} bytes, {size} when it was built (truncated or overwritten)")
        if check_digests and _file_entry(file)["sha256"] != manifest[name]["sha256"]:
            raise _damaged(path, name, "does not hold the bytes it was built with (its SHA-256 differs)")
    if check_digests:
        _VERIFIED.add(path)
    return meta


def existing_cache(data_cfg: DataSpec) -> str | None:
    """The cache of `data_cfg` if it is built, else None; builds, trains and writes nothing (for dry runs).

    None also when what would key it is not there yet: an untrained SentencePiece model, an unprepared
    TFDS dataset."""
    if data_cfg.tokenizer == "sentencepiece" and not os.path.exists(tokenizers.sentencepiece_path(data_cfg)):
        return None
    if not sources.is_available(data_cfg):
        return None
    path = cache_path(data_cfg, tokenizers.get_tokenizer(data_cfg))
    return path if os.path.isfile(os.path.join(path, "meta.json")) else None


def epochs(tokens: int, train_split_tokens: int | None) -> float | None:
    """Passes over the training split: tokens trained on / tokens of the split (None when unknown)."""
    return tokens / train_split_tokens if train_split_tokens else None

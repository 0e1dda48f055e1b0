"""Local text files as documents: `data.files` / `data.eval_files` (globs, `~` expanded: a string of comma-separated
globs, `\\,` for a comma inside one, or a list of globs; spec.data.split_globs).

  .txt               one document per file
  .jsonl, .jsonl.gz  one document per line, its text under `data.text_feature`
  .parquet           one document per row of the column `data.text_feature` (read with pyarrow)

Without `data.eval_files`, a document is held out for evaluation when the hash of its content falls
below `data.eval_fraction`: the split never depends on file order or on the other documents.
Every problem with the files is a ConfigError naming the setting, the file and (for jsonl) the line.

The files' fingerprint (`files_fingerprint`, the data identity's `source`) is content-addressed: each file's path
relative to the files' common folder and the SHA-256 of its content, the split rule and the text field; never a
modification time or an absolute path. A touched file is the same data, and a copy of the corpus in another
folder (a node-local copy) has the same fingerprint, so it reuses the token cache and the SentencePiece model.
"""
from __future__ import annotations

import functools
import glob
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterator


from transformer.spec import ConfigError, DataSpec
from transformer.spec.data import split_globs

EXTENSIONS = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
_PARQUET_BATCH_ROWS = 1024
MAX_INVALID_FRACTION = 0.3  # more of a file's (or jsonl line's) bytes not UTF-8: not text (Latin-1 prose: < 0.2)


def _extension(path: str) -> str:
    for ext in sorted(EXTENSIONS, key=len, reverse=True):
        if path.endswith(ext):
            return ext
    return ""


def expand(setting: str, value: str | list[str] | tuple[str, ...]) -> list[str]:
    """The sorted, de-duplicated files matched by the globs of `value` (spec.data.split_globs)."""
    found: list[str] = []
    for pattern in split_globs(value, setting):
        full = os.path.abspath(os.path.expanduser(pattern))
        if os.path.isdir(full):
            raise ConfigError(f"{setting}={pattern!r} is a directory; give a glob of files, "
                              f"e.g. {os.path.join(pattern, '*.txt')!r}")
        matches = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
        if not matches:
            raise ConfigError(f"{setting}: the glob {pattern!r} matches no file")
        for path in matches:
            if not _extension(path):
                raise ConfigError(f"{setting}: {path} has an unknown extension; "
                                  f"use one of {', '.join(EXTENSIONS)}")
        found.extend(matches)
    if not found:
        raise ConfigError(f"{setting}={value!r} names no file")
    return sorted(set(found))


def decode_text(data: bytes, path: str, setting: str, where: str = "") -> str:
    """`data` decoded as UTF-8 (an invalid byte becomes U+FFFD); ConfigError naming the file when it is not text:
    a NUL byte, or more than MAX_INVALID_FRACTION of its bytes not UTF-8 (a binary file, or another encoding)."""
    if b"\0" in data:
        raise ConfigError(f"{setting}: {path}{where} is not text (it holds NUL bytes: a binary file?); "
                          f"data.files reads UTF-8 text")
    try:
        return data.decode("utf-8")  # the common case: one pass
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8", errors="replace")
    invalid = len(data) - len(data.decode("utf-8", errors="ignore").encode("utf-8"))
    if invalid > MAX_INVALID_FRACTION * len(data):
        raise ConfigError(f"{setting}: {path}{where} is not UTF-8 text ({invalid} of its {len(data)} bytes are not "
                          f"UTF-8: a binary file, or another encoding? convert it with iconv -t UTF-8)")
    return text


def _lines(path: str, setting: str) -> Iterator[bytes]:
    """The raw lines of a .jsonl or .jsonl.gz file; a .gz that is not gzip is a ConfigError naming it."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            yield from f
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ConfigError(f"{setting}: {path} is not a readable gzip file ({e})") from None


def _jsonl_documents(path: str, text_feature: str, setting: str) -> Iterator[str]:
    for line_no, raw in enumerate(_lines(path, setting), start=1):
        line = decode_text(raw, path, setting, f" line {line_no}")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{setting}: {path} line {line_no} is not JSON: {e.msg.removesuffix(' at')} at column "
                              f"{e.colno} (near {line[max(0, e.pos - 20):e.pos + 20]!r})") from None
        if not isinstance(record, dict) or text_feature not in record:
            raise ConfigError(f"{setting}: {path} line {line_no} has no field data.text_feature={text_feature!r}")
        text = record[text_feature]
        if not isinstance(text, str):
            raise ConfigError(f"{setting}: {path} line {line_no}: field {text_feature!r} is "
                              f"{type(text).__name__}, not a string")
        yield text


def _parquet_documents(path: str, text_feature: str, setting: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for files that are not parquet
        raise ConfigError(f"{setting}: {path} is not a readable parquet file: {e}") from None
    columns = parquet.schema_arrow.names
    if text_feature not in columns:
        raise ConfigError(f"{setting}: {path} has no column data.text_feature={text_feature!r}; "
                          f"its columns: {', '.join(columns)}")
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[text_feature]):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text if isinstance(text, str) else bytes(text).decode("utf-8", errors="replace")


def read_file(path: str, text_feature: str, setting: str) -> Iterator[str]:
    """The documents of one file, in file order (empty documents skipped)."""
    ext = _extension(path)
    if ext == ".txt":
        with open(path, "rb") as f:
            docs: Iterator[str] = iter([decode_text(f.read(), path, setting)])
    elif ext == ".parquet":
        docs = _parquet_documents(path, text_feature, setting)
    else:
        docs = _jsonl_documents(path, text_feature, setting)
    return (d for d in docs if d)


def is_held_out(text: str, fraction: float) -> bool:
    """Whether a document goes to the evaluation split: sha1 of its UTF-8 content below `fraction`."""
    digest = hashlib.sha1(text.encode("utf-8", errors="replace")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2.0 ** 64


def split_files(data_cfg: DataSpec) -> dict[str, tuple[str, list[str]]]:
    """{"train"|"eval": (setting name, files)}; without eval files both read `data.files`."""
    data_cfg = DataSpec.of(data_cfg)  # data.eval_fraction in (0, 1) when data.eval_files is empty
    train = expand("data.files", data_cfg.files)
    if data_cfg.has_eval_files:
        return {"train": ("data.files", train), "eval": ("data.eval_files", expand("data.eval_files",
                                                                                  data_cfg.eval_files))}
    return {"train": ("data.files", train), "eval": ("data.files", train)}


def iter_split(data_cfg: DataSpec, split: str) -> Iterator[str]:
    """The documents of `split` ("train" or "eval") in a fixed order: files sorted, each in file order."""
    data_cfg = DataSpec.of(data_cfg)
    setting, paths = split_files(data_cfg)[split]
    for path in paths:
        for text in read_file(path, data_cfg.text_feature, setting):
            if data_cfg.holds_out and is_held_out(text, data_cfg.eval_fraction) != (split == "eval"):
                continue
            yield text


def cache_dir(data_cfg: DataSpec) -> str:
    """`data.cache_dir`, else ~/.cache/transformer (tokenized data and trained tokenizers)."""
    d = str(data_cfg.get("cache_dir", "") or "") or os.path.join("~", ".cache", "transformer")
    return os.path.abspath(os.path.expanduser(d))


_HASH_CHUNK = 1 << 20


@functools.lru_cache(maxsize=65536)
def _file_digest(path: str, stat_key: tuple[int, ...]) -> str:
    """SHA-256 of a file's content; memoised per (path, inode, size, mtime, ctime) within a process, so
    the loop's repeated evaluations (each makes a new iterator) do not re-read the files. Any write
    changes ctime, which no tool sets back."""
    del stat_key  # part of the memo key only
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stat_digest(path: str, setting: str) -> tuple[os.stat_result, str]:
    """(os.stat, content SHA-256) of a file; a file that cannot be read is a ConfigError naming it."""
    try:
        st = os.stat(path)
        return st, _file_digest(path, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    except OSError as e:
        raise ConfigError(f"{setting}: cannot read {path} ({e.strerror or e})") from None


def file_digests(split: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    """{path: SHA-256 of its content} of every file of `split` (split_files' result)."""
    return {path: _stat_digest(path, setting)[1] for setting, paths in split.values() for path in paths}


def common_root(paths: list[str]) -> str:
    """The deepest folder holding every one of `paths` (absolute): what their fingerprint's paths are relative to."""
    return os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""


FINGERPRINT_PREFIX = "files:"  # files_fingerprint's; a fingerprint without it is a legacy one (mtimes included)


def files_fingerprint(data_cfg: DataSpec,
                      split: dict[str, tuple[str, list[str]]] | None = None) -> str:
    """"files:" + a hash of what defines the documents (the module docstring): each cache split's setting, and for
    each of its files the path relative to common_root of all of them and the content's SHA-256; the text field;
    the split rule. `split`: split_files(data_cfg), when the caller has it (the files are then not globbed again).
    Modification times only memoise the digests (_file_digest)."""
    data_cfg = DataSpec.of(data_cfg)
    split = split_files(data_cfg) if split is None else split
    root = common_root([p for _, paths in split.values() for p in paths])
    h, legacy = hashlib.sha256(b"files-v2\n"), hashlib.sha256()
    for name, (setting, paths) in sorted(split.items()):
        for x in (h, legacy):
            x.update(f"{name}|{setting}\n".encode())
        for path in paths:
            st, digest = _stat_digest(path, setting)
            h.update(f"{os.path.relpath(path, root)}|{digest}\n".encode())
            legacy.update(f"{path}|{st.st_size}|{st.st_mtime_ns}|{digest}\n".encode())
    rule = (f"text_feature={data_cfg.text_feature}|held_out={data_cfg.holds_out}|"
            f"fraction={float(data_cfg.eval_fraction) if data_cfg.holds_out else 0}").encode()
    h.update(rule)
    legacy.update(rule)
    fingerprint = FINGERPRINT_PREFIX + h.hexdigest()[:20]
    _LEGACY[fingerprint] = legacy.hexdigest()[:20]
    return fingerprint


# fingerprint -> the legacy fingerprint of the files this process last fingerprinted as it (legacy_matches)
_LEGACY: dict[str, str] = {}


def legacy_matches(fingerprint: str, legacy: str) -> bool | None:
    """Whether `legacy`, a fingerprint recorded by an older version (a hash of each file's absolute path, size,
    modification time and content, the text field and the split rule: no "files:" prefix), is that of the files
    this process last fingerprinted as `fingerprint` (identity.resolve_data computes it just before a change check);
    None when it computed no such fingerprint. A touched or moved file does not match it: such old records compare
    content only where their files are listed."""
    found = _LEGACY.get(fingerprint)
    return None if found is None else legacy == found

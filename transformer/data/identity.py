"""A run's data resolved once: the documents' identity, the tokenizer, and the token cache they key.

"Same data" is defined once, here and in documents.files_fingerprint: the data identity (recorded in
DIR/config.json as `data.identity`, and so in every checkpoint's config; a sweep's sweep.json as `data_identity`):
  source     sources.fingerprint: what defines the documents of both cache splits. Local files: "files:" + a hash
             of the split rule, the text field and each file's path relative to the files' common folder and the
             SHA-256 of its content (documents.files_fingerprint; never a modification time: a touched file, or the
             corpus copied to another folder, is the same data). A TFDS dataset: "tfds:" + its full name, splits
             and sizes
  tokenizer  the tokenizer's fingerprint
  cache_key  token_cache.cache_key(source, tokenizer): the token cache's directory name (its meta.json records
             both fingerprints, checked when the cache is opened: token_cache.verify)
  files      local files only: [[setting, path, SHA-256 of the content], ...], to say what changed (up to
             MAX_LISTED_FILES files; beyond, [] and the source, one digest of them all, decides; a list, not a
             mapping, because config.json is read back as a ConfigDict, whose keys hold no dots)
The SentencePiece model trained on local files is keyed by the same source (tokenizers.sentencepiece_path).
`resolve_data` computes it once per run (the files are globbed and hashed once; the pipeline, every
evaluation and the tasks take the RunData instead of re-deriving the tokenizer and the fingerprints).
`describe_change` says how two identities differ: a resumed, continued (wsd) or sweep run whose data or
tokenizer changed is refused with it (training/run_io.check_workdir_config; a config whose data.identity is
set, as a sweep sets it from sweep.json, must resolve to it: training/resolve.py; a sweep's plan compares
sweep.json's `data_identity` with the data's now: sweeps/runner.write_sweep). Records written before the
content-addressed source (a source without the "files:" prefix) still compare: see describe_change.
`check_settings` refuses evaluation on training data before anything is read: data.eval_split equal to
data.train_split, or data.eval_files (or a set of data.eval_sets: eval_sets.check_files) naming a file of data.files
(the same path, or the same content).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any


from transformer.data import corpus, documents, eval_sets, sources, token_cache, tokenizers
from transformer.data.tokenizers import Tokenizer
from transformer.spec import ConfigError, DataSpec

IDENTITY_KEY = "identity"  # config.json: data.identity
MAX_LISTED_FILES = 1000    # more files: only the source fingerprint is recorded (config.json stays small)


def check_settings(data_cfg: DataSpec,
                   split: dict[str, tuple[str, list[str]]] | None = None) -> None:
    """ConfigError when evaluation would read training data (see the module docstring). `split`:
    documents.split_files(data_cfg), when the caller has it. (Also: data.files beside a non-default
    data.tfds_name, sources.check_source.)"""
    data_cfg = DataSpec.of(data_cfg)
    sources.check_source(data_cfg)
    if data_cfg.uses_files:
        split = documents.split_files(data_cfg) if split is None else split
    eval_sets.check_files(data_cfg, split)  # data.eval_sets: no file of data.files
    if not data_cfg.has_eval_files:
        return
    train, evals = split["train"][1], split["eval"][1]
    same_path = sorted(set(map(os.path.realpath, train)) & set(map(os.path.realpath, evals)))
    if same_path:
        raise ConfigError(f"data.eval_files names {len(same_path)} file(s) of data.files ({', '.join(same_path[:3])}"
                          f"{', ...' if len(same_path) > 3 else ''}): evaluation would be on training data; make "
                          f"the two globs disjoint, or leave data.eval_files empty to hold out data.eval_fraction")
    digests = documents.file_digests(split)
    train_by_digest = {digests[p]: p for p in train}
    same_content = [(p, train_by_digest[digests[p]]) for p in evals if digests[p] in train_by_digest]
    if same_content:
        pairs = ", ".join(f"{e} = {t}" for e, t in same_content[:3])
        raise ConfigError(f"data.eval_files: {len(same_content)} file(s) have the content of a file of data.files "
                          f"({pairs}{', ...' if len(same_content) > 3 else ''}): evaluation would be on training "
                          f"data; remove the copies from one side")


@dataclasses.dataclass(frozen=True, eq=False)
class RunData:
    """The resolved data of a run: `config` (its data settings, a DataSpec), the one `tokenizer`, the documents'
    `source` fingerprint and (local files) `files` = {setting: {path: content SHA-256}}."""

    config: DataSpec
    tokenizer: Tokenizer
    source: str
    files: dict[str, dict[str, str]]

    @property
    def cache_key(self) -> str:
        return token_cache.cache_key(self.source, self.tokenizer.fingerprint)

    @property
    def cache_path(self) -> str:
        """The token cache's directory (built or not)."""
        return token_cache.cache_path(self.config, self.tokenizer, self.source)

    def identity(self) -> dict[str, Any]:
        """What config.json records as data.identity (JSON types only)."""
        rows = [[setting, path, digest] for setting, paths in sorted(self.files.items())
                for path, digest in sorted(paths.items())]
        return {"source": self.source, "tokenizer": self.tokenizer.fingerprint, "cache_key": self.cache_key,
                "files": rows if len(rows) <= MAX_LISTED_FILES else []}

    def ensure_cache(self, verbose: bool = True) -> str:
        """The token cache of these documents and this tokenizer, built on first use, checked when it was there
        (token_cache.ensure_cache: sizes always, digests once per process)."""
        return token_cache.ensure_cache(self.config, self.tokenizer, verbose, source_fingerprint=self.source)


def resolve_data(data_cfg: DataSpec, tokenizer: Tokenizer | None = None,
                 workdir: str | None = None) -> RunData:
    """Checks the data settings and resolves them once: the files globbed and hashed, the tokenizer (default:
    tokenizers.get_tokenizer(data_cfg, workdir)) and the source fingerprint. `data_cfg`: a DataSpec (a config's
    data block is made one: its plain-value checks run first)."""
    data_cfg = DataSpec.of(data_cfg)
    split = documents.split_files(data_cfg) if data_cfg.uses_files else None
    check_settings(data_cfg, split)
    tokenizer = tokenizer if tokenizer is not None else tokenizers.get_tokenizer(data_cfg, workdir)
    if split is None:
        return RunData(data_cfg, tokenizer, sources.fingerprint(data_cfg), {})
    digests = documents.file_digests(split)
    files: dict[str, dict[str, str]] = {}
    for setting, paths in split.values():
        files.setdefault(setting, {}).update({p: digests[p] for p in paths})
    return RunData(data_cfg, tokenizer, documents.files_fingerprint(data_cfg, split), files)


def check_data(data_cfg: DataSpec) -> None:
    """Checks data settings as a run resolves them, without building, training or writing anything: the plain
    values, one source, the files (globs match, every file readable; evaluation not on training data) and the
    tokenizer (its file loads). A SentencePiece model not trained yet is trained by the first run: only the files
    are checked; a TFDS dataset not prepared yet is built by it. ConfigError naming the setting on a mistake (a
    sweep calls this once, before it designs or launches anything)."""
    data_cfg = DataSpec.of(data_cfg)
    split = documents.split_files(data_cfg) if data_cfg.uses_files else None
    check_settings(data_cfg, split)
    if data_cfg.tokenizer == "sentencepiece" and not os.path.exists(tokenizers.sentencepiece_path(data_cfg)):
        return  # its path hashes every file: they are readable
    tokenizer = tokenizers.get_tokenizer(data_cfg)  # loads the file
    if sources.is_available(data_cfg):
        resolve_data(data_cfg, tokenizer)  # the identity a run will record: every file hashed (memoised)


def resolvable(data_cfg: DataSpec, tokenizer: Any) -> bool:
    """Whether resolve_data can run without building anything: a tokenizer with a fingerprint (a dry run's
    stand-in for an untrained SentencePiece model has none) and documents readable as they are."""
    return bool(getattr(tokenizer, "fingerprint", None)) and sources.is_available(data_cfg)


def ensure_available(data_cfg: DataSpec) -> None:
    """Builds the TFDS dataset when it is not prepared yet (a first run on a machine), so that a training run
    resolves and records its data identity from its first invocation on (a dry run never builds: `resolvable`).
    Local files are read as they are."""
    if not sources.is_available(data_cfg):
        corpus.load_split(data_cfg, data_cfg.train_split)


def peek(data_cfg: DataSpec) -> dict[str, Any] | None:
    """The data identity when it can be computed without building or training anything (a sweep records it in
    sweep.json before its first run), else None: an untrained SentencePiece model, an unprepared dataset."""
    if data_cfg.tokenizer == "sentencepiece" and not os.path.exists(tokenizers.sentencepiece_path(data_cfg)):
        return None
    if not sources.is_available(data_cfg):
        return None
    return resolve_data(data_cfg).identity()


def describe_change(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str | None:
    """How data identity `new` differs from the recorded `old` (None: the same data, or nothing recorded).

    By content, never by modification time or folder: equal sources are the same documents (a touched file, or the
    corpus copied to another folder, keeps its source). Otherwise, where both list their files, the change names
    the files added, removed or changed (content digest), each compared by its path — relative to its record's
    common folder (documents.common_root) when the corpus moved, so a copy is named by what differs in it; where a
    list is missing (more than MAX_LISTED_FILES files, a TFDS dataset), the sources are named.
    A record written before the content-addressed source (issue 29: a local-files source without the "files:"
    prefix) compares by its listed files, as above; without a list it holds only a hash of each file's absolute
    path, size, modification time and content, which documents.legacy_matches recomputes from the files now: the
    same files, untouched and in place, are the same data; anything else (even a touch) is refused with a message
    that says the content cannot be compared, never accepted unseen."""
    if not old or not new:
        return None
    changes = []
    if old.get("tokenizer") != new.get("tokenizer"):
        changes.append(f"the tokenizer changed (data.tokenizer: recorded {old.get('tokenizer')}, now "
                       f"{new.get('tokenizer')})")
    old_source, new_source = str(old.get("source", "")), str(new.get("source", ""))
    if old_source != new_source:
        changes.extend(_document_changes(old, new, old_source, new_source))
    return "; ".join(changes) or None


def _document_changes(old: dict[str, Any], new: dict[str, Any], old_source: str, new_source: str) -> list[str]:
    """describe_change's account of two different sources (empty: the same documents after all)."""
    old_rows, new_rows = old.get("files") or [], new.get("files") or []
    if old_rows and new_rows:
        moved = not {r[1] for r in old_rows} & {r[1] for r in new_rows}  # no path in common: compare relative paths
        (old_root, was_all), (new_root, now_all) = (_by_setting(rows, moved) for rows in (old_rows, new_rows))
        changes = []
        for setting in sorted(set(was_all) | set(now_all)):
            was, now = was_all.get(setting, {}), now_all.get(setting, {})
            for what, paths, root in (("added", sorted(set(now) - set(was)), new_root),
                                      ("removed", sorted(set(was) - set(now)), old_root),
                                      ("changed", sorted(p for p in set(was) & set(now) if was[p] != now[p]), new_root)):
                if paths:
                    named = [os.path.join(root, p) for p in paths[:5]]
                    changes.append(f"{setting}: {what} {', '.join(named)}{', ...' if len(paths) > 5 else ''}")
        if not changes and not _legacy(old_source):
            changes.append("the split rule or the text field changed (data.eval_fraction, data.text_feature)")
        return changes
    if _legacy(old_source) and new_source.startswith(documents.FINGERPRINT_PREFIX):
        if documents.legacy_matches(new_source, old_source):
            return []
        return [f"the recorded identity is of an older format (source {old_source}: a hash of the files' absolute "
                f"paths, sizes, modification times and content, the files not listed) and the files now give another "
                f"hash: a file was added, removed, changed, moved or only touched; the content cannot be compared "
                f"with that record"]
    return [f"the documents changed (source fingerprint {old_source} -> {new_source})"]


def _legacy(source: str) -> bool:
    """Whether `source` is a local-files fingerprint of the older format (mtimes and absolute paths included)."""
    return bool(source) and not source.startswith((documents.FINGERPRINT_PREFIX, corpus.FINGERPRINT_PREFIX))


def _by_setting(rows: Any, relative: bool) -> tuple[str, dict[str, dict[str, str]]]:
    """identity()["files"] rows -> (root, {setting: {path: digest}}): paths relative to their common folder (root),
    or absolute (root "")."""
    root = documents.common_root([path for _, path, _ in rows]) if relative else ""
    out: dict[str, dict[str, str]] = {}
    for setting, path, digest in rows:
        out.setdefault(setting, {})[os.path.relpath(path, root) if relative else path] = digest
    return root, out


def check_same(where: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
    """ConfigError when the data identity `new` differs from the one `where` recorded."""
    change = describe_change(old, new)
    if change:
        raise ConfigError(f"{where} was trained on other data or with another tokenizer: {change}. Its checkpoints, "
                          f"embedding and bits per byte belong to the recorded data; restore it, or use a new "
                          f"workdir for the new data")

"""Text corpora as random-access data sources: the built-in `stdlib_py` corpus or any TFDS dataset.

`stdlib_py` is the `.py` source of the running Python's standard library, built on first use as a
TFDS dataset in ArrayRecord format (no TensorFlow needed). Files go to `train` or `validation` by a
hash of their relative path, so the split never depends on the order files are found in. One
builder config per Python minor version (`py3_11`, ...) keeps different standard libraries apart.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from etils import epath
import tensorflow_datasets as tfds

from transformer import file_claims
from transformer.spec import ConfigError, DataSpec

BUILTIN_NAME = "stdlib_py"
FINGERPRINT_PREFIX = "tfds:"  # fingerprint()'s
VALIDATION_PERCENT = 2  # of files, chosen by sha1 of the relative path
_EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__")

log = logging.getLogger(__name__)


def stdlib_root() -> str:
    """The running Python's standard-library directory."""
    return sysconfig.get_paths()["stdlib"]


def split_of(relative_path: str) -> str:
    """`validation` for ~VALIDATION_PERCENT% of paths (by sha1 of the path), else `train`."""
    digest = hashlib.sha1(relative_path.encode("utf-8")).digest()
    return "validation" if int.from_bytes(digest[:8], "big") % 100 < VALIDATION_PERCENT else "train"


def list_stdlib_files(root: str) -> list[str]:
    """Relative paths of the `.py` files under `root`, sorted, skipping installed packages."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def _config_name() -> str:
    return f"py{sys.version_info.major}_{sys.version_info.minor}"


class StdlibPy(tfds.core.GeneratorBasedBuilder):
    """The `.py` files of the running Python's standard library, one example per file."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: stdlib .py files, sha1-of-path train/validation split."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(name=_config_name(), description=f"Python {sys.version.split()[0]} stdlib"),
    ]

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        # TFDS's own lookup needs the `importlib_resources` package, which is not installed here.
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Source code of the Python standard library (.py files).",
            features=tfds.features.FeaturesDict({
                "text": tfds.features.Text(),
                "path": tfds.features.Text(),  # relative to the stdlib root
            }),
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[str, dict[str, str]]]]:
        root = stdlib_root()
        by_split: dict[str, list[str]] = {"train": [], "validation": []}
        for rel in list_stdlib_files(root):
            by_split[split_of(rel)].append(rel)
        sizes = {s: sum(os.path.getsize(os.path.join(root, r)) for r in rels) for s, rels in by_split.items()}
        self.info.metadata.update({
            "python_version": sys.version.split()[0],
            "stdlib_root": root,
            "file_count": sum(len(r) for r in by_split.values()),
            "total_bytes": sum(sizes.values()),
            "split_file_counts": {s: len(r) for s, r in by_split.items()},
            "split_bytes": sizes,
            "validation_rule": f"sha1(relative_path)[:8] as big-endian int % 100 < {VALIDATION_PERCENT}",
        })
        return {s: self._generate_examples(root, rels) for s, rels in by_split.items()}

    def _generate_examples(self, root: str, rels: Sequence[str]) -> Iterator[tuple[str, dict[str, str]]]:
        for rel in rels:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                yield rel, {"text": f.read(), "path": rel}


def resolve_data_dir(data_cfg: DataSpec) -> str:
    """`data.data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    d = data_cfg.data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.join("~", "tensorflow_datasets")
    return os.path.abspath(os.path.expanduser(d))


def dataset_key(data_cfg: DataSpec) -> str:
    """A file-name-safe name of the configured dataset (the built-in one includes its Python version)."""
    name = f"{BUILTIN_NAME}_{_config_name()}" if data_cfg.tfds_name == BUILTIN_NAME else data_cfg.tfds_name
    return name.replace("/", "_").replace(":", "_")


@contextlib.contextmanager
def _quiet_tfds() -> Iterator[None]:
    """Silences TFDS while it builds the local corpus: its "Downloading and preparing dataset Unknown
    size" banner (nothing downloads), its nested progress bars, its INFO logs and warnings."""
    from tensorflow_datasets.core.utils import tqdm_utils

    was_active, absl_logger = tqdm_utils._active, logging.getLogger("absl")
    level = absl_logger.level
    tfds.display_progress_bar(False)
    absl_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        tfds.display_progress_bar(was_active)
        absl_logger.setLevel(level)


_USER_FILE_EXTENSIONS = (".txt", ".jsonl", ".jsonl.gz", ".parquet", ".json", ".md", ".csv")


def _user_files(folder: str) -> list[str]:
    """The names of text-like files directly in `folder` (a TFDS data dir holds dataset folders)."""
    if not os.path.isdir(folder):
        return []
    return sorted(e.name for e in os.scandir(folder) if e.is_file() and e.name.lower().endswith(_USER_FILE_EXTENSIONS))


def check_data_dir(data_cfg: DataSpec, data_dir: str) -> None:
    """A ConfigError when `data.data_dir` is a folder of the user's own text files, not a TFDS data
    directory (TFDS would otherwise build the built-in corpus inside it)."""
    own = _user_files(data_dir)
    if own:
        ext = os.path.splitext(own[0])[1] if not own[0].endswith(".jsonl.gz") else ".jsonl.gz"
        raise ConfigError(
            f"data.data_dir={data_cfg.data_dir!r} holds your own files ({', '.join(own[:3])}"
            f"{', ...' if len(own) > 3 else ''}), but data.data_dir is where TFDS datasets are kept. "
            f"To train on your files use --config.data.files='{os.path.join(data_cfg.data_dir, '*' + ext)}'")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("~", "/", ".")) or bool(_user_files(name))


def _stdlib_builder(data_dir: str) -> StdlibPy:
    with _quiet_tfds():  # in a fresh data dir TFDS warns that the variant folder has no dataset_info.json
        return StdlibPy(data_dir=data_dir, file_format="array_record")


def _stdlib_prepared(data_dir: str) -> bool:
    with _quiet_tfds():
        return _stdlib_builder(data_dir).is_prepared()


def _build_stdlib(data_dir: str) -> None:
    print(f"Building the {BUILTIN_NAME}/{_config_name()} corpus in {data_dir} ...", flush=True)
    start = time.perf_counter()
    builder = _stdlib_builder(data_dir)
    with _quiet_tfds():  # TFDS writes into a temporary folder and renames it into place when complete
        builder.download_and_prepare()
    md = builder.info.metadata
    print(f"Built {BUILTIN_NAME}: {md['file_count']} files, {md['total_bytes']} bytes "
          f"in {time.perf_counter() - start:.1f} s", flush=True)


def prepare_stdlib(data_dir: str) -> StdlibPy:
    """Builds `stdlib_py` under `data_dir` unless already there; safe to call from several processes and hosts
    on a shared file system (file_claims.build_once: one builds, the others wait; no file lock)."""
    claim = os.path.join(data_dir, BUILTIN_NAME, f"{_config_name()}.building")
    file_claims.build_once(lambda: _stdlib_prepared(data_dir), claim, lambda: _build_stdlib(data_dir),
                           waiting=f"waiting for another process to build the {BUILTIN_NAME}/{_config_name()} "
                                   f"corpus in {data_dir} (claim {claim})")
    return _stdlib_builder(data_dir)  # its info read from disk


class TextSource:
    """A random-access source whose records are dicts with `text` as bytes (plus the other features)."""

    def __init__(self, source: Sequence[Mapping[str, Any]], text_feature: str):
        self._source = source
        self._feature = text_feature

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = dict(self._source[index])
        text = record.pop(self._feature)
        record["text"] = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return record

    def __repr__(self) -> str:
        return f"TextSource({self._source!r}, text_feature={self._feature!r})"

    @property
    def dataset_info(self) -> Any:
        """The TFDS DatasetInfo of the dataset the records come from."""
        return self._source.dataset_info


def load_split(data_cfg: DataSpec, split: str) -> TextSource:
    """The records of `split` of `data.tfds_name`: `len(src)`, `src[i]["text"]` (bytes)."""
    data_dir = resolve_data_dir(data_cfg)
    if _looks_like_path(str(data_cfg.tfds_name)):
        raise ConfigError(f"data.tfds_name={data_cfg.tfds_name!r} is a path, not a TFDS dataset name; to train on "
                          f"local files use --config.data.files='{os.path.join(data_cfg.tfds_name, '*.txt')}' "
                          "(.txt, .jsonl, .jsonl.gz, .parquet)")
    check_data_dir(data_cfg, data_dir)
    if data_cfg.tfds_name == BUILTIN_NAME:
        builder = prepare_stdlib(data_dir)
        if split not in builder.info.splits:
            raise ConfigError(f"split {split!r} is not in {BUILTIN_NAME}; choose one of "
                              f"{', '.join(builder.info.splits)}")
        return TextSource(builder.as_data_source(split=split), "text")
    try:
        source = tfds.data_source(data_cfg.tfds_name, data_dir=data_dir, split=split, download=False)
    except Exception as e:  # tfds raises several types (not found, not prepared, bad split)
        first_line = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ConfigError(
            f"cannot load TFDS dataset data.tfds_name={data_cfg.tfds_name!r} split={split!r} from "
            f"data.data_dir={data_dir!r}: {first_line.strip().rstrip('.')}. Prepare it first (`tfds build {data_cfg.tfds_name} "
            f"--data_dir=...`) or use the built-in data.tfds_name={BUILTIN_NAME!r}.") from e
    features = source.dataset_info.features
    if data_cfg.text_feature not in features:
        raise ConfigError(f"data.text_feature={data_cfg.text_feature!r} is not a feature of "
                          f"{data_cfg.tfds_name}; choose one of {', '.join(features.keys())}")
    return TextSource(source, data_cfg.text_feature)


def fingerprint(data_cfg: DataSpec, splits: Sequence[str]) -> str:
    """A hash of what defines the documents of `splits`: the dataset's full name (name/config/version),
    each split's name, record count and size, the text feature and, for the built-in corpus, the Python
    version and byte counts it was built from. A prepared TFDS version does not change, so its records
    are not hashed."""
    h = hashlib.sha256(f"text_feature={data_cfg.text_feature}".encode())
    for split in splits:
        info = load_split(data_cfg, split).dataset_info
        h.update(f"|{info.full_name}|{split}|{info.splits[split].num_examples}|"
                 f"{int(info.splits[split].num_bytes)}".encode())
        if data_cfg.tfds_name == BUILTIN_NAME:
            md = info.metadata
            h.update(f"|{md['python_version']}|{md['total_bytes']}|{md['split_bytes']}".encode())
    return FINGERPRINT_PREFIX + h.hexdigest()[:20]


def is_prepared(data_cfg: DataSpec) -> bool:
    """Whether `data.tfds_name` is ready to read in the data dir, without building or writing anything."""
    data_dir = resolve_data_dir(data_cfg)
    try:
        with _quiet_tfds():
            if data_cfg.tfds_name == BUILTIN_NAME:
                return StdlibPy(data_dir=data_dir, file_format="array_record").is_prepared()
            return tfds.builder(data_cfg.tfds_name, data_dir=data_dir).is_prepared()
    except Exception:  # noqa: BLE001 - an unknown or unreadable dataset is simply not prepared
        return False


def corpus_metadata(data_cfg: DataSpec) -> dict[str, Any]:
    """Provenance of the built-in corpus (Python version, file counts, bytes); {} for other datasets."""
    if data_cfg.tfds_name != BUILTIN_NAME or DataSpec.of(data_cfg).uses_files:
        return {}
    return dict(prepare_stdlib(resolve_data_dir(data_cfg)).info.metadata)

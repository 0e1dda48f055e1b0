"""What every command-line entry point shares: JAX set-up and user-facing error handling.

A user's mistake — a bad flag value, an unknown `--config.KEY`, a missing config file or dataset, an
invalid setting — prints one `error: ...` line naming the setting (and the valid values where there
is a short list) and exits with status 2, without a traceback and before anything is written. Set
TRANSFORMER_TRACEBACK=1 to see the traceback as well.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable

from absl import app, flags, logging as absl_logging

from transformer.models.config import ConfigError

USER_ERRORS = (ConfigError, FileNotFoundError, ValueError)
_HUGE_PAGES = "glibc.malloc.hugetlb=1"


def use_huge_pages() -> None:
    """Re-executes this process once with glibc's malloc on transparent huge pages (Linux, glibc >= 2.35).

    XLA:CPU allocates the step's temporaries (hundreds of MB) afresh on every call; on 4 KiB pages
    each step page-faults them all in again (186k faults and 0.5 cores of kernel time per step of the
    GPT-2 benchmark; 2 MiB pages: 1.2k faults, and the step 1.4x faster, BENCHMARKS.md). The variable
    is read only at process start, hence the re-exec. TRANSFORMER_HUGE_PAGES=0 turns it off.
    """
    import platform

    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if os.environ.get("TRANSFORMER_HUGE_PAGES", "1") == "0" or "glibc.malloc.hugetlb" in tunables:
        return
    libc, version = platform.libc_ver()
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read()
    except OSError:
        return
    if libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35) or "[never]" in thp:
        return
    os.environ["GLIBC_TUNABLES"] = f"{tunables}:{_HUGE_PAGES}" if tunables else _HUGE_PAGES
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def setup_jax(config: Any | None = None) -> None:
    """Persistent compilation cache, then `jax.distributed` when the config or cluster asks for it."""
    import logging

    import jax

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU/GPU backend" notices
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/transformer/jax"))
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if config is not None and "distributed" in config:
        from transformer.training import distributed
        distributed.initialize(config.distributed)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _last_error_line(text: str) -> str:
    """The `SomeError: message` line a nested traceback (quoted by config_flags) ends with."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line):
            return re.sub(r"^[A-Za-z_.]*(Error|Exception):\s*", "", line)
    return lines[-1] if lines else text


def _is_config_flag(name: str) -> bool:
    from ml_collections.config_flags import config_flags

    return name in flags.FLAGS and isinstance(flags.FLAGS[name], config_flags._ConfigFlag)


def _load_config(argv: list[str], root: str) -> Any:
    """The config `--ROOT=FILE[:ARG]` names, loaded the way config_flags does (get_config(ARG))."""
    import importlib.util

    spec = [a.split("=", 1)[1] for a in argv[1:] if a.lstrip("-").split("=")[0] == root and "=" in a][-1]
    path, *args = spec.split(":")
    module_spec = importlib.util.spec_from_file_location("_cli_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(*args)


def _unknown_key(argv: list[str], error: Exception) -> str:
    """Message for `--config.a.b=V` naming a key the config lacks, with the valid keys at that level."""
    missing = str(error).strip("\"' ")
    for arg in argv[1:]:
        name = arg.lstrip("-").split("=")[0]
        root, _, dotted = name.partition(".")
        if not dotted or not _is_config_flag(root) or missing not in dotted.split("."):
            continue
        path = dotted.split(".")
        valid = ""
        try:
            node = _load_config(argv, root)
            for part in path[:path.index(missing)]:
                node = node[part]
            valid = f"; valid keys{' under ' + '.'.join(path[:path.index(missing)]) if path.index(missing) else ''}: " \
                    f"{', '.join(sorted(node.keys()))}"
        except Exception:  # noqa: BLE001 - the config itself failed to load: no list to offer
            pass
        return f"--{name}: {missing!r} is not a setting of this config{valid}"
    return f"unknown config setting {missing!r}"


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with each kind of bad command line turned into one `error:` line (exit 2)."""
    try:
        rest = flags.FLAGS(argv)
        for name in {a.lstrip("-").split("=")[0] for a in argv[1:] if a.startswith("--") and "." not in a.split("=")[0]}:
            if _is_config_flag(name):
                flags.FLAGS[name].value.keys()  # config_flags defers a failed load to the first use
        return rest
    except flags.UnrecognizedFlagError as e:
        name = str(e).split("'")[1] if "'" in str(e) else ""
        root, _, dotted = name.partition(".")
        if dotted and _is_config_flag(root):
            _fail(_unknown_key(argv, KeyError(dotted.split(".")[-1])))
        _fail(f"{e}; see --helpfull for the flags")
    except flags.Error as e:
        text = str(e)
        m = re.match(r"^flag (--[^=\s]+)(=[^:]*)?:", text)
        if "\n" in text:  # config_flags quotes the config file's traceback
            _fail(f"{m.group(1) if m else 'flags'}: {_last_error_line(text)}")
        _fail(text)
    except (AttributeError, KeyError) as e:  # config_flags: an override names a key the config lacks
        _fail(_unknown_key(argv, e))
    except (OSError, ValueError, TypeError) as e:  # e.g. the config file is missing or does not import
        line = _last_error_line(str(e))
        named = [a.split("=")[0] for a in argv[1:] if "=" in a and f"'{a.split('=', 1)[1].split(':')[0]}'" in line]
        _fail(f"{named[0]}: {line}" if named else line)
    return argv  # unreachable


def run(main: Callable[[list[str]], None]) -> None:
    """absl's app.run, but a user's mistake (bad flag, bad config, missing file) prints one line and exits 2."""

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except USER_ERRORS as e:
            if os.environ.get("TRANSFORMER_TRACEBACK"):
                raise
            _fail(str(e))

    use_huge_pages()
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax/grain INFO lines would drown the progress
    app.run(guarded, flags_parser=parse_flags)

"""What every command-line entry point shares: `run(main)`, which turns a user's mistake into one line.

A user's mistake — a bad flag value, an unknown `--config.KEY`, a missing config file, an invalid
setting (the project's `ConfigError`, raised before anything expensive or written) — prints one
`error: ...` line naming the setting (and the valid values where there is a short list) and exits
with status 2. Any other exception is a bug, not bad input: it keeps its traceback (exit 1). Set
TRANSFORMER_TRACEBACK=1 to see the traceback of a user error as well.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable

from absl import app, flags, logging as absl_logging

from experiments.huge_pages import use_huge_pages
from transformer.spec import ConfigError

USER_ERRORS = (ConfigError,)  # the project's input errors (MissingInputError is one); nothing else
_USER_ERROR_NAMES = {"ConfigError", "MissingInputError"}  # the same, as a config file's quoted traceback names them


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _quoted_error(text: str) -> tuple[str, str]:
    """(exception class name, message) of the `pkg.SomeError: message` line a traceback quoted by config_flags
    ends with; ("", last line) when there is none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception))\b:?\s*(.*)$", line)
        if m:
            return m.group(1).rsplit(".", 1)[-1], m.group(2)
    return "", lines[-1] if lines else text


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


def _missing_key(error: BaseException) -> tuple[str, str | None]:
    """(the key a config lookup missed, ml_collections' suggestion or None) from its KeyError/AttributeError.

    ml_collections raises KeyError("'step'\\nDid you mean \\"steps\\" instead of \\"step\\"?"), wrapped in an
    AttributeError for attribute access; str() of either is the repr of that text."""
    while isinstance(error, AttributeError) and error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    text = str(error.args[0]) if error.args else str(error)
    first, _, rest = text.partition("\n")
    suggestion = re.search(r'Did you mean "([^"]+)"', rest)
    return first.strip("\"' "), suggestion.group(1) if suggestion else None


def _unknown_key(argv: list[str], error: BaseException) -> str | None:
    """Message for `--config.a.b=V` naming a key the config lacks: the suggestion and the valid keys there.
    None when no override names the missing key (a config file's own bad lookup: a bug)."""
    missing, suggestion = _missing_key(error)
    for arg in argv[1:]:
        name = arg.lstrip("-").split("=")[0]
        root, _, dotted = name.partition(".")
        if not dotted or not _is_config_flag(root) or missing not in dotted.split("."):
            continue
        path = dotted.split(".")
        parent = path[:path.index(missing)]
        where = ".".join(parent)
        message = f"--{name}: {missing!r} is not a setting of this config"
        if suggestion:
            message += f" (did you mean {'.'.join(parent + [suggestion])!r}?)"
        try:
            node = _load_config(argv, root)
            for part in parent:
                node = node[part]
            message += f"; valid keys{' under ' + where if where else ''}: {', '.join(sorted(node.keys()))}"
        except Exception:  # noqa: BLE001 - the config itself failed to load: no list to offer
            pass
        return message
    return None


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
            _fail(_unknown_key(argv, KeyError(dotted.split(".")[-1])) or f"unknown config setting {name!r}")
        _fail(f"{e}; see --helpfull for the flags")
    except flags.Error as e:
        text = str(e)
        if "\n" not in text:
            _fail(text)
        # config_flags quotes the config file's traceback: one line for the project's input errors, else a bug
        kind, message = _quoted_error(text)
        if kind not in _USER_ERROR_NAMES or os.environ.get("TRANSFORMER_TRACEBACK"):
            print(text, file=sys.stderr, flush=True)
            raise SystemExit(1)
        m = re.match(r"^flag (--[^=\s]+)(=[^:]*)?:", text)
        _fail(f"{m.group(1) if m else 'flags'}: {message}")
    except (AttributeError, KeyError) as e:  # config_flags: an override names a key the config lacks
        message = _unknown_key(argv, e)
        if message is None:
            raise
        _fail(message)
    except OSError as e:  # config_flags: the config file is missing or unreadable
        line = _quoted_error(str(e))[1]
        named = [a.split("=")[0] for a in argv[1:] if "=" in a and f"'{a.split('=', 1)[1].split(':')[0]}'" in line]
        _fail(f"{named[0]}: {line}" if named else line)
    return argv  # unreachable


def run(main: Callable[[list[str]], None]) -> None:
    """absl's app.run after the huge-page re-exec; a user error prints one line and exits 2, a bug keeps
    its traceback and exits 1."""

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

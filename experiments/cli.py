"""What every command-line entry point shares: `run(main)`, which turns a user's mistake into one line.

A user's mistake — a bad flag value, an unknown `--config.KEY`, a missing config file or one that is not
Python (`--config=points.csv`), an invalid setting (the project's `ConfigError`, raised before anything
expensive or written), an argument that is not a `--flag` (no command takes one: `steps=30` would be
ignored) — prints one `error: ...` line naming the setting (and the valid values where there is a short list)
and exits with status 2.

So does an error of the environment the user runs in: an `OSError` (itself, the one a library's exception
was raised `from`, or the one tensorstore, orbax's checkpoint storage, reports as a ValueError ending
`[os_error_code='28']`) that names a file (its filename, or the file object or absolute-path argument of the
frame that raised it: a `write()` or a file's close does not carry the name) and whose errno says what is
wrong with the file system, not with the program:
  EACCES, EPERM    permission denied: the user may not write (or read) there;
  EROFS            the file system is mounted read-only;
  ENOSPC, EDQUOT   the disk, or the user's quota, is full;
and, on a path the user named (a flag's or a `--config.KEY`'s value, or a path under it), EEXIST, ENOTDIR and
EISDIR: `--workdir=FILE`, `--workdir=FILE/run`, `--out=DIR` where a file is written. The kernel raises
these errnos for the state of the file system (its permissions, mount flags, free space), which the user
changes and the program cannot; the line names the file and the cause, and rerunning the command once it is
fixed resumes (a run from its checkpoint, a sweep from results.jsonl). A library's log record of the same
exception (orbax logs a failed asynchronous save from each of its threads) is left out: the one line says it.
Any other `OSError` (ENOENT, EBADF, EINVAL, a socket's or a subprocess's error; one without a file) may be a
bug and, like any other exception, keeps its traceback (exit 1); so does EEXIST on a path the program chose
itself. Set TRANSFORMER_TRACEBACK=1 to see the traceback of a user or environment error as well.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import re
import sys
from typing import Any, Callable

from absl import app, flags, logging as absl_logging

from experiments.huge_pages import use_huge_pages
from transformer.spec import ConfigError

USER_ERRORS = (ConfigError,)  # the project's input errors (MissingInputError is one); nothing else
_USER_ERROR_NAMES = {"ConfigError", "MissingInputError"}  # the same, as a config file's quoted traceback names them
# the file system's state, whatever file it concerns (see the module docstring): errno -> what to do about it
ENVIRONMENT_ERRNOS = {
    errno.EACCES: "choose a path you have access to, or change its permissions",
    errno.EPERM: "choose a path you have access to, or change its permissions",
    errno.EROFS: "choose a directory on a writable file system",
    errno.ENOSPC: "free space on that file system, or choose a directory on another one",
    errno.EDQUOT: "free space within your quota, or choose a directory outside it",
}
# a path the user named that is the wrong kind of thing: errno -> what it means there
NAMED_PATH_ERRNOS = {
    errno.EEXIST: "it exists and is not a directory",
    errno.ENOTDIR: "a part of it is a file, not a directory",
    errno.EISDIR: "it is a directory; a file is written there",
}


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


def _named_paths(argv: list[str]) -> dict[str, str]:
    """{absolute path: "--flag=VALUE"} for the value of each `--flag=VALUE` and `--config.KEY=VALUE` (each part
    of a comma-separated one too), as a path relative to the current directory; the longest first."""
    named = {}
    for arg in argv[1:]:
        if arg.startswith("-") and "=" in arg:
            value = arg.split("=", 1)[1]
            for part in (value, *value.split(",")):
                path = os.path.normpath(os.path.abspath(os.path.expanduser(part.strip())))
                if part.strip() and path != os.sep:  # "/" would hold every path
                    named.setdefault(path, arg)
    return dict(sorted(named.items(), key=lambda item: -len(item[0])))


def _frame_file(frame: Any) -> str | None:
    """The file a frame was working on: a file object among its locals (where `f.write`, `json.dump(obj, f)`
    or a file's close fail), else its first argument that is an absolute path (an `os.write(fd, ...)` in a
    function given the path)."""
    for value in frame.f_locals.values():
        if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
            return value.name
    code = frame.f_code
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if isinstance(value, str) and os.path.isabs(value):
            return value
    return None


def _failed_file(error: OSError) -> str | None:
    """The file an OSError concerns: its filename, else the innermost frame of its traceback that names one."""
    if isinstance(error.filename, (str, bytes)):
        return os.fsdecode(error.filename)
    frames, tb = [], error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return next((path for path in map(_frame_file, reversed(frames)) if path is not None), None)


_TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")


def _os_error(error: BaseException) -> OSError | None:
    """The OSError `error` is: itself, the one it was raised `from` (a library's wrapper), or the one tensorstore
    (orbax's checkpoint storage) reports as a ValueError quoting the file and ending `[os_error_code='28']`."""
    while not isinstance(error, OSError) and error.__cause__ is not None:
        error = error.__cause__
    if not isinstance(error, ValueError):
        return error if isinstance(error, OSError) else None
    code, paths = _TENSORSTORE_ERRNO.search(str(error)), re.findall(r'"(/[^"]*)"', str(error))
    return OSError(int(code.group(1)), os.strerror(int(code.group(1))), paths[-1]) if code and paths else None


def environment_error(error: BaseException, argv: list[str]) -> str | None:
    """The one `error:` line for an error of the user's environment (the module docstring says which), or None:
    anything else may be a bug and keeps its traceback. An exception raised `from` such an OSError is one too
    (a library that wraps it); an exception merely raised while handling one is not."""
    error = _os_error(error)
    if error is None or error.errno not in {**ENVIRONMENT_ERRNOS, **NAMED_PATH_ERRNOS}:
        return None
    path = _failed_file(error)
    if path is None:
        return None
    full = os.path.normpath(os.path.abspath(path))
    named = _named_paths(argv)
    flag = next((arg for p, arg in named.items() if full == p or full.startswith(p.rstrip(os.sep) + os.sep)), None)
    where = flag if flag and named.get(full) == flag else f"{flag}: {path}" if flag else path
    if error.errno in ENVIRONMENT_ERRNOS:
        return f"{where}: {os.strerror(error.errno)}; {ENVIRONMENT_ERRNOS[error.errno]}, then rerun the command"
    if flag is not None:  # EEXIST, ENOTDIR, EISDIR: on a path the user named, that path is the wrong kind
        return f"{where}: {NAMED_PATH_ERRNOS[error.errno]} ({os.strerror(error.errno)})"
    return None


class _EnvironmentErrorLogs(logging.Filter):
    """Drops a library's log record of an exception that is an environment error: the command reports it once,
    as its one `error:` line (orbax logs a failed asynchronous save from each of its threads, with a traceback,
    before the save's error reaches the command)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exception = record.exc_info[1] if record.exc_info else None
        # sys.argv is None once the interpreter shuts down, where asyncio may still log a checkpoint's callbacks
        return exception is None or sys.argv is None or environment_error(exception, sys.argv) is None


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with each kind of bad command line turned into one `error:` line (exit 2)."""
    for arg in argv[1:]:  # a config file is Python: a CSV or JSON given to --config would fail as a NameError
        name, _, value = arg.lstrip("-").partition("=")
        path = value.split(":")[0]
        if arg.startswith("-") and _is_config_flag(name) and os.path.isfile(path) and not path.endswith(".py"):
            _fail(f"--{name}={value}: {path} is not a config file; --{name} names a Python file with get_config(), "
                  f"e.g. configs/lm.py:gpt2_tiny")
    try:
        rest = flags.FLAGS(argv)
        if len(rest) > 1:  # no command takes one: `steps=30` or `--dry_run true` would be ignored
            _fail(f"unexpected argument(s) {' '.join(rest[1:])!r}: options are given as --name=value "
                  f"(a boolean as --name or --noname)")
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
        except Exception as e:  # noqa: BLE001 - an environment error is one line; anything else is re-raised
            message = environment_error(e, sys.argv)
            if message is None or os.environ.get("TRANSFORMER_TRACEBACK"):
                raise
            _fail(message)

    use_huge_pages()
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax/grain INFO lines would drown the progress
    absl_logging.get_absl_handler().addFilter(_EnvironmentErrorLogs())
    app.run(guarded, flags_parser=parse_flags)

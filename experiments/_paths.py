"""Path arguments made absolute once, at the command line, so every command works from any directory.

A path flag (`DEFINE_path`: --workdir, --out, --baseline, ...) is parsed into an absolute path (`~` expanded)
relative to the directory the command was started in; `absolute_config` does the same for the path settings of
a training or sweep config (CONFIG_PATHS: data.files and data.eval_files glob by glob, a data.tokenizer file,
data.cache_dir, data.data_dir, train.init_from; a sweep's base.* of those and sweep.grid_from, sweep.lr_fit).
Below the command line every path is absolute: orbax refuses relative checkpoint paths, and a run's
config.json (and a sweep's sweep.json) then names the same files from wherever the run is resumed.

A setting that starts with `~` is kept as written (the library expands it where it reads it), so the
recorded config of a run or sweep given `~/...` is what it always was; a data.tokenizer or train.init_from that
names no existing path is kept as typed, for the library's error message.

A path that cannot be what the user meant is one error, before anything is written: a `~name` that is no
user's home (it would become a directory literally named `~name` in the current directory), or a `$VARIABLE`
the shell did not expand (a path in single quotes in a job script: it would become a directory named
`$SCRATCH`). A path that exists is taken as it is, whatever its characters; spaces, commas (in a path flag)
and any Unicode are ordinary characters of a path.
"""
from __future__ import annotations

import glob
import inspect
import os
import re
import sys
from typing import Any

from absl import flags

from transformer.spec import ConfigError
from transformer.spec.data import join_globs, split_globs

CONFIG_PATHS = ("data.files", "data.eval_files", "data.tokenizer", "data.cache_dir", "data.data_dir",
                "train.init_from")
SWEEP_PATHS = ("sweep.grid_from", "sweep.lr_fit")
GLOB_LISTS = ("data.files", "data.eval_files")  # globs (a comma-separated string or a list), each made absolute
TOKENIZER_NAMES = ("bytes", "sentencepiece")    # data.tokenizer values that are not files
IF_PRESENT = ("data.tokenizer", "train.init_from")  # made absolute only when the path is there: anything else
                                                     # is left as typed for the library's error (or a name)


_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def unmeant(path: str) -> str | None:
    """Why `path`, as typed, cannot be the path the user meant (the module docstring), or None."""
    if os.path.exists(os.path.expanduser(path)) or glob.glob(os.path.expanduser(path)):
        return None
    for part in path.split(","):
        part = part.strip()
        if part.startswith("~") and os.path.expanduser(part) == part:
            user = part[1:].split(os.sep, 1)[0]
            return f"~{user} is no user's home directory on this machine (~/ is yours)"
    variable = _VARIABLE.search(path)
    if variable:
        return (f"{variable.group(0)} is a shell variable that was not expanded (the path was quoted with '...'?); "
                f"write the path out or let the shell expand it")
    return None


def absolute(path: str | None) -> str | None:
    """`path` with `~` expanded, made absolute against the current directory; None and "" unchanged."""
    if not path:
        return path
    return os.path.abspath(os.path.expanduser(path))


class _PathParser(flags.ArgumentParser):
    """absl parser of a path flag: the value made absolute when the command line is parsed."""

    syntactic_help = "a path (relative to the current directory, ~ expanded)"

    def parse(self, argument: str) -> str:
        problem = unmeant(argument) if argument else None
        if problem:
            raise ValueError(problem)  # absl: "flag --NAME=VALUE: <problem>", one `error:` line (experiments/cli.py)
        return absolute(argument)

    def flag_type(self) -> str:
        return "path"


def DEFINE_path(name: str, default: str | None, help: str, **kwargs: Any) -> flags.FlagHolder:  # noqa: N802
    """flags.DEFINE_string whose value is an absolute path (see the module docstring)."""
    caller = inspect.currentframe().f_back.f_globals.get("__name__", "")
    module = sys.argv[0] if caller == "__main__" else caller  # where absl lists the flag in --help
    return flags.DEFINE(_PathParser(), name, default, help, serializer=flags.ArgumentSerializer(),
                        module_name=module, **kwargs)


def _relative(value: str) -> bool:
    return bool(value) and not os.path.isabs(value) and not value.startswith("~")


def _absolute_setting(key: str, value: Any) -> Any:
    if key in GLOB_LISTS and isinstance(value, (list, tuple)):  # a list of globs (spec.data.split_globs)
        return [os.path.abspath(p) if isinstance(p, str) and _relative(p.strip()) else p for p in value]
    if not isinstance(value, str) or not value.strip():
        return value
    if key in GLOB_LISTS:  # comma-separated, "\\," a comma inside a glob (spec.data.split_globs)
        return join_globs([os.path.abspath(p) if _relative(p) else p for p in split_globs(value, key)])
    if key == "data.tokenizer" and value in TOKENIZER_NAMES:
        return value
    if key in IF_PRESENT and not os.path.exists(value):
        return value
    return os.path.abspath(value) if _relative(value) else value


def absolute_config(config: Any) -> Any:
    """Makes the relative path settings of a training config, or of a sweep config's `base` and `sweep`
    sections, absolute against the current directory, in place; returns `config`."""
    sections = [(config.base, CONFIG_PATHS), (config, SWEEP_PATHS)] if "base" in config else [(config, CONFIG_PATHS)]
    for node, keys in sections:
        for key in keys:
            section, name = key.split(".")
            if section in node and name in node[section]:
                value = node[section][name]
                problem = unmeant(value) if isinstance(value, str) and value.strip() else None
                if problem:
                    raise ConfigError(f"{'base.' if node is not config else ''}{key}={value!r}: {problem}")
                node[section][name] = _absolute_setting(key, node[section][name])
    return config

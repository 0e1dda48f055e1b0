"""The project's configuration errors (the bottom of the package: nothing else of it is imported here)."""
from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A user's configuration mistake; the message names the setting and valid values."""


class MissingInputError(ConfigError, FileNotFoundError):
    """A file or directory the user named (a flag, a config setting, a CSV) does not exist or is not what it
    must be; still a FileNotFoundError for callers that catch that."""


def check_choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
    """ConfigError unless `value` is one of `valid`; `name` is the setting (e.g. "model.family")."""
    if value not in valid:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(valid)}")


def check_positive_int(name: str, value: Any) -> None:
    """ConfigError unless `value` is an int (not a bool) above 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")

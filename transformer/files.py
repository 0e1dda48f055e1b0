"""Atomic JSON files: write to a temporary name unique to this writer in the same directory, then
os.replace. Readers see the old file or the new one, never a torn one; and two processes writing the
same file at once (two sweep runners on one DIR, say) do not pull each other's temporary file away."""
from __future__ import annotations

import json
import os
import uuid
from typing import Any


def write_json(path: str, obj: Any, **dump_kwargs: Any) -> None:
    """json.dump(obj) to `path` atomically; `dump_kwargs` go to json.dump (indent=2 by default)."""
    dump_kwargs.setdefault("indent", 2)
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, **dump_kwargs)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)

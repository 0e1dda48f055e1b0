"""What a result was computed with: package versions, the machine, XLA's flags and the code's commit.

`record()` is the one description of "the environment", written into every run's summary.json and every sweep's
results rows and fit.json, so that two machines' different figures can be told apart from a bug (issue 34: the
same quick sweep differed by up to 0.014 in eval loss between an AMD EPYC with AVX2 and an Intel Xeon with
AVX-512/AMX, and nothing said why). Standard library only, so any layer may read it; the JAX devices are named
only where JAX is imported already (a fit or a dry run never imports it for this).

  packages      {name: version} of the numerics stack (None where not installed)
  python        the interpreter's version
  platform      OS and machine (e.g. "Linux-6.1-x86_64")
  cpu           the CPU model (/proc/cpuinfo or platform.processor()) and the vector extensions XLA's CPU
                code generation uses (avx2, avx512f, avx512_bf16, amx_tile, ...)
  devices       JAX's backend, device kind and count, when JAX is imported
  xla_flags     $XLA_FLAGS and $JAX_PLATFORMS, as set
  git           the commit of the checkout this code runs from, and whether it had uncommitted changes
                (None outside a git checkout)
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import Any

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "ml-collections", "grain",
            "tensorflow-datasets", "tokenizers", "sentencepiece", "jax-cuda13-plugin", "libtpu")
CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile",
                "amx_bf16", "asimd", "sve")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, Any]:
    """{"model": the CPU model name, "features": the listed vector extensions it has, "count": logical CPUs}."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "CPU part") and model in ("", platform.machine(), "x86_64"):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "features": [f for f in CPU_FEATURES if f in flags], "count": os.cpu_count()}


@functools.lru_cache(maxsize=1)
def git() -> dict[str, Any] | None:
    """{"commit": HEAD's hash, "dirty": uncommitted changes to tracked files} of the checkout holding this
    code, or None (not a git checkout, or git absent)."""
    if not os.path.exists(os.path.join(REPO, ".git")):
        return None
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def devices() -> dict[str, Any] | None:
    """JAX's backend, first device kind and device count; None when JAX is not imported in this process."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    found = jax.devices()
    return {"backend": jax.default_backend(), "kind": found[0].device_kind, "count": len(found),
            "process_count": jax.process_count()}


def record() -> dict[str, Any]:
    """The environment of this process (see the module docstring), JSON types only."""
    return {"packages": {name: _version(name) for name in PACKAGES if _version(name) is not None},
            "python": platform.python_version(), "platform": platform.platform(terse=True), "cpu": cpu(),
            "devices": devices(),
            "xla_flags": {k: os.environ[k] for k in ("XLA_FLAGS", "JAX_PLATFORMS") if k in os.environ},
            "git": git()}


def brief(env: dict[str, Any] | None) -> dict[str, Any] | None:
    """The few fields of a record that a results row keeps (the full record is in the run's summary.json): the
    versions of jax, jaxlib and flax, the CPU model and its vector extensions, the device kind, the commit."""
    if not env:
        return None
    packages, cpu_, devices_, git_ = env.get("packages", {}), env.get("cpu") or {}, env.get("devices") or {}, \
        env.get("git") or {}
    return {"jax": packages.get("jax"), "jaxlib": packages.get("jaxlib"), "flax": packages.get("flax"),
            "cpu": cpu_.get("model"), "cpu_features": cpu_.get("features"), "device": devices_.get("kind"),
            "commit": (git_.get("commit") or "")[:12] or None}


def describe_difference(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """What differs between two recorded environments that can move a figure: package versions, the CPU model
    and its vector extensions, the devices and XLA's flags (the commit is named where both have one)."""
    if not a or not b:
        return []
    out = []
    pa, pb = a.get("packages", {}), b.get("packages", {})
    out += [f"{n} {pa.get(n)} vs {pb.get(n)}" for n in sorted(set(pa) | set(pb)) if pa.get(n) != pb.get(n)]
    ca, cb = a.get("cpu") or {}, b.get("cpu") or {}
    if ca.get("model") != cb.get("model"):
        out.append(f"CPU {ca.get('model')!r} vs {cb.get('model')!r}")
    if ca.get("features") != cb.get("features"):
        out.append(f"CPU features {ca.get('features')} vs {cb.get('features')}")
    for key in ("devices", "xla_flags"):
        if a.get(key) != b.get(key):
            out.append(f"{key} {a.get(key)} vs {b.get(key)}")
    ga, gb = a.get("git") or {}, b.get("git") or {}
    if ga.get("commit") and gb.get("commit") and ga["commit"] != gb["commit"]:
        out.append(f"code {ga['commit'][:10]} vs {gb['commit'][:10]}")
    return out

"""Process set-up: re-execute once with glibc's malloc on transparent huge pages."""
from __future__ import annotations

import os
import platform
import sys

_HUGE_PAGES = "glibc.malloc.hugetlb=1"


def use_huge_pages() -> None:
    """Re-executes this process once with glibc's malloc on transparent huge pages (Linux, glibc >= 2.35).

    XLA:CPU allocates the step's temporaries (hundreds of MB) afresh on every call; on 4 KiB pages
    each step page-faults them all in again (186k faults and 0.5 cores of kernel time per step of the
    GPT-2 benchmark; 2 MiB pages: 1.2k faults, and the step 1.4x faster, BENCHMARKS.md). The variable
    is read only at process start, hence the re-exec. TRANSFORMER_HUGE_PAGES=0 turns it off.
    """
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

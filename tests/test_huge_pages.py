"""experiments.huge_pages.use_huge_pages: the command-line tools re-execute once with malloc on huge pages."""
import os
import platform
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ("import os, sys; from experiments.huge_pages import use_huge_pages; "
          "print('start', flush=True); use_huge_pages(); print('tunables', os.environ.get('GLIBC_TUNABLES'))")


def _thp_available() -> bool:
    libc, version = platform.libc_ver()
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read()
    except OSError:
        return False
    return libc == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35) and "[never]" not in thp


def _run(**env: str) -> list[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "TRANSFORMER_HUGE_PAGES")}
    full.update(env, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, check=True)
    return out.stdout.split("\n")


@pytest.mark.skipif(not _thp_available(), reason="needs glibc >= 2.35 and transparent huge pages")
def test_reexecutes_once_with_hugetlb_and_keeps_the_users_tunables():
    lines = _run()
    assert lines.count("start") == 2  # the first process was replaced by exactly one re-execution
    assert "tunables glibc.malloc.hugetlb=1" in lines
    lines = _run(GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert "tunables glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1" in lines


@pytest.mark.skipif(not _thp_available(), reason="needs glibc >= 2.35 and transparent huge pages")
def test_every_command_line_entry_point_gets_it():
    """experiments.cli.run (what every experiments/*.py main goes through) re-executes with it."""
    script = ("import os; from experiments import cli; "
              "cli.run(lambda argv: print('tunables', os.environ.get('GLIBC_TUNABLES')))")
    full = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "TRANSFORMER_HUGE_PAGES")}
    out = subprocess.run([sys.executable, "-c", script], env={**full, "PYTHONPATH": REPO}, capture_output=True,
                         text=True, check=True)
    assert "tunables glibc.malloc.hugetlb=1" in out.stdout.split("\n")


def test_can_be_turned_off_and_respects_an_explicit_setting():
    assert _run(TRANSFORMER_HUGE_PAGES="0") == ["start", "tunables None", ""]
    assert _run(GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == ["start", "tunables glibc.malloc.hugetlb=0", ""]

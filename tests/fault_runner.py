"""Runs command lines of the fault trial (tests/test_fault_trial*.py) cheaply, each in a process of its own.

`run_commands(cases)` starts one Python that imports the heavy third-party libraries once (JAX, Flax, optax,
orbax, grain, SciPy, TFDS, matplotlib: about 3 s of the 3.5 s a command needs to fail on a bad setting), then
forks one child per case that runs `python -m MODULE ARGS` as the interpreter would (`runpy.run_module(...,
alter_sys=True)`, the same sys.argv, sys.path, environment and exit status; an uncaught exception prints its
traceback and exits 1). Nothing of this project is imported before the fork, so each child defines its flags
and reads its configs afresh, as a new process does. The fork happens only while the parent has a single
thread (importing those libraries starts none, and no JAX backend is initialised); otherwise, or with
FAULT_TRIAL_FORK=0, every case is a plain `python -m` subprocess (tests/test_fault_trial.py checks that both
give the same outcome).

For each case the runner lists the files (and directories) under the case's `watch` directories before and
after it, so a test can assert that a refused command wrote nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ("jax", "flax.linen", "optax", "orbax.checkpoint", "grain", "scipy.stats", "tensorflow_datasets",
           "ml_collections", "absl.app", "matplotlib.pyplot")

_RUNNER = r'''
import json, os, runpy, signal, subprocess, sys, threading, time, traceback

spec = json.load(open(sys.argv[1]))
fork = spec["fork"]
if fork:
    for name in spec["preload"]:
        __import__(name)
    fork = threading.active_count() == 1


def listing(roots):
    seen = {}
    for root in roots:
        for d, dirs, files in os.walk(root):
            for name in dirs:
                seen[os.path.join(d, name) + "/"] = None
            for name in files:
                p = os.path.join(d, name)
                try:
                    st = os.lstat(p)
                    seen[p] = (st.st_size, st.st_mtime_ns)
                except OSError:
                    pass
    return seen


def child(case, out, err):
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    code = 1
    try:
        os.environ.update(case.get("env", {}))
        if case.get("uid") is not None:
            os.setgroups([])
            os.setgid(case["uid"])
            os.setuid(case["uid"])
        sys.argv = list(case["argv"])
        try:
            runpy.run_module(case["argv"][0], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_forked(case, out, err):
    pid = os.fork()
    if pid == 0:
        child(case, out, err)
    deadline = time.time() + case["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.01)


def run_plain(case, out, err):
    uid = case.get("uid")
    try:
        with open(out, "w") as o, open(err, "w") as e:
            return subprocess.run([sys.executable, "-m", *case["argv"]], stdout=o, stderr=e, timeout=case["timeout"],
                                  env={**os.environ, **case.get("env", {})}, user=uid, group=uid,
                                  extra_groups=[] if uid is not None else None).returncode
    except subprocess.TimeoutExpired:
        return "timeout"


results = []
for i, case in enumerate(spec["cases"]):
    before = listing(case["watch"])
    out, err = os.path.join(spec["dir"], f"{i}.out"), os.path.join(spec["dir"], f"{i}.err")
    start = time.time()
    code = (run_forked if fork else run_plain)(case, out, err)
    after = listing(case["watch"])
    changed = sorted(p for p in set(before) | set(after) if before.get(p, 0) != after.get(p, 0))
    results.append({"returncode": code, "stdout": open(out, errors="replace").read(),
                    "stderr": open(err, errors="replace").read(), "changed": changed, "forked": fork,
                    "seconds": time.time() - start})
json.dump(results, open(spec["results"], "w"))
'''


def environment(data_dir: str | None = None) -> dict[str, str]:
    """The environment of the commands: this checkout first on the path, CPU JAX with one device (nothing here
    needs a mesh; tests/xla_env.py), no huge-page re-exec, no traceback of user errors."""
    env = {**os.environ, "PYTHONPATH": REPO, "TRANSFORMER_HUGE_PAGES": "0", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": xla_flags(1)}
    env.pop("TRANSFORMER_TRACEBACK", None)
    if data_dir:
        env["TFDS_DATA_DIR"] = data_dir
    return env


def run_commands(cases: list[dict], data_dir: str | None = None, fork: bool | None = None,
                 cwd: str = REPO) -> list[dict]:
    """Runs each case {"argv": [MODULE, *ARGS], "watch": [DIR, ...], "uid": optional, "env": optional,
    "timeout": seconds (default 300)} in `cwd` (this checkout is on PYTHONPATH), one after the other; returns per
    case {"returncode" (an int, or "timeout"), "stdout", "stderr", "changed" (paths under `watch` added, removed or
    modified; a directory ends in /), "forked", "seconds"}."""
    if fork is None:
        fork = os.environ.get("FAULT_TRIAL_FORK", "1") != "0"
    with tempfile.TemporaryDirectory(prefix="fault-runner-") as tmp:
        spec = {"fork": fork, "preload": PRELOAD, "dir": tmp, "results": os.path.join(tmp, "results.json"),
                "cases": [{"watch": [], "timeout": 300, **case} for case in cases]}
        with open(os.path.join(tmp, "spec.json"), "w") as f:
            json.dump(spec, f)
        longest = sum(c["timeout"] for c in spec["cases"]) + 120
        subprocess.run([sys.executable, "-c", _RUNNER, os.path.join(tmp, "spec.json")], cwd=cwd,
                       env=environment(data_dir), check=True, timeout=longest)
        with open(spec["results"]) as f:
            return json.load(f)


def error_lines(result: dict) -> list[str]:
    """The lines of a command's output that report an error (`error: ...`, or `fit: error: ...`)."""
    return [ln for ln in (result["stdout"] + result["stderr"]).splitlines() if "error:" in ln]

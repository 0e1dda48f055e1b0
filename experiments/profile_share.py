"""Where a profiled step's device time goes: matmuls, cuDNN attention, everything else.

  python -m experiments.profile_share --trace_dir=DIR [--json] [--top=N]

DIR is a `jax.profiler` trace directory (`experiments.bench --profile_dir=DIR`, or a run's DIR/profile/ from
`logging.profile_start`); its newest DIR/plugins/profile/<time>/*.xplane.pb is read with jax's own
`jax.profiler.ProfileData` (no TensorFlow, no xprof).

Device time: on a GPU (or TPU) the kernels of the plane `/device:...` (its `Stream ...` lines; on a TPU its
`XLA Ops` line), each kernel attributed to its HLO instruction by the event's `hlo_op` stat; on the CPU, where
XLA:CPU has no device plane, the host threads' events that carry an `hlo_op` stat (one per executed
instruction: a fusion, a dot, a copy). Control flow (`while`, `conditional`, `call`) is left out: on the CPU
its event spans its body's instructions, which have events of their own. Times are summed over kernels
(overlapping streams or threads count each), so shares are of the summed kernel time.

Each instruction is classified by the compiled HLO text when DIR holds it (`*.hlo.txt`, as the bench writes):
  matmul     dot, convolution, a custom-call to a GEMM (cuBLAS, cuBLASLt, oneDNN matmul) or a convolution,
             or a fusion whose computation holds one (a Triton GEMM, a dot with its fused epilogue)
  attention  a custom-call to cuDNN's fused attention (`__cudnn$fmha...`), or a fusion holding one
  other      everything else: elementwise and reduction fusions, copies, transposes, collectives, ...
Without the HLO text, by the kernel's and the instruction's name (gemm, cublas, cutlass, xmma, nvjet, dot,
conv → matmul; fmha, sdpa, flash → attention), which misses XLA:CPU's YNNPACK fusions (`ynn_fusion.N`, a dot
or a reduction: only the HLO tells). The module is the one with the most device time (the train step).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import sys
from typing import Any

from absl import flags

from transformer.spec import MissingInputError

CATEGORIES = ("matmul", "attention", "other")
CONTROL_FLOW = ("while", "conditional", "call")
_ATTENTION_NAME = re.compile(r"fmha|sdpa|flash|dot_product_attention", re.I)
_MATMUL_NAME = re.compile(r"gemm|matmul|cublas|cutlass|xmma|nvjet|conv|(^|[^a-z])dot([^a-z]|$)", re.I)
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One executed HLO instruction (or GPU kernel): its module, instruction, kernel name, start, duration."""
    module: str
    op: str
    kernel: str
    start_ns: float
    duration_ns: float


def _opcode(rest: str) -> str:
    """The opcode of an instruction's right-hand side `SHAPE opcode(operands), attributes`."""
    i = 0
    if rest.startswith("("):  # a tuple shape: skip its balanced parentheses
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        i += 1
    else:
        i = rest.find(" ")
    m = re.match(r"\s*([\w\-]+)\(", rest[i:])
    return m.group(1) if m else ""


def _own_category(opcode: str, rest: str) -> str:
    """The category of an instruction by itself (a fusion's contents aside)."""
    if opcode in ("dot", "convolution", "ragged-dot"):
        return "matmul"
    if opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]*)"', rest)
        target = target.group(1) if target else ""
        if _ATTENTION_NAME.search(target):
            return "attention"
        if re.search(r"gemm|matmul|cublas|conv", target, re.I):
            return "matmul"
    return "other"


def hlo_categories(hlo_text: str) -> tuple[str, dict[str, str]]:
    """(module name, {instruction name: matmul | attention | other | control}) of a compiled module's HLO text;
    a fusion takes the category of what its computation holds (attention before matmul before other)."""
    module, computation = "", ""
    body: dict[str, list[tuple[str, str, str]]] = {}  # computation -> [(instruction, opcode, rest)]
    for line in hlo_text.splitlines():
        if line.startswith("HloModule "):
            module = line.split()[1].rstrip(",")
        elif (m := _COMPUTATION.match(line)) and not line.startswith(" "):
            computation = m.group(1)
            body[computation] = []
        elif (m := _INSTRUCTION.match(line)) and computation:
            body[computation].append((m.group(1), _opcode(m.group(2)), m.group(2)))
    memo: dict[str, str] = {}

    def holds(comp: str) -> str:
        if comp not in memo:
            memo[comp] = "other"  # guards a cycle (none in valid HLO)
            found = {category(op, rest) for _, op, rest in body.get(comp, [])}
            memo[comp] = next((c for c in ("attention", "matmul") if c in found), "other")
        return memo[comp]

    def category(opcode: str, rest: str) -> str:
        own = _own_category(opcode, rest)
        if own != "other" or opcode != "fusion":
            return own
        called = _CALLED.search(rest)
        return holds(called.group(1)) if called else "other"

    out = {}
    for instructions in body.values():
        for name, opcode, rest in instructions:
            out[name] = "control" if opcode in CONTROL_FLOW else category(opcode, rest)
    return module, out


def name_category(op: str, kernel: str) -> str:
    """The category from names alone (no HLO text): control flow, cuDNN attention, a GEMM kernel or a dot."""
    if op.split(".")[0] in CONTROL_FLOW:
        return "control"
    if _ATTENTION_NAME.search(kernel) or _ATTENTION_NAME.search(op):
        return "attention"
    if _MATMUL_NAME.search(kernel) or _MATMUL_NAME.search(op):
        return "matmul"
    return "other"


def save_hlo(compiled: Any, trace_dir: str) -> str:
    """Writes a compiled step's HLO text into trace_dir as <module>.hlo.txt (what `summarize` classifies by)."""
    text = compiled.as_text()
    module = next((ln.split()[1].rstrip(",") for ln in text.splitlines() if ln.startswith("HloModule ")), "module")
    path = os.path.join(trace_dir, f"{module}.hlo.txt")
    with open(path, "w") as f:
        f.write(text)
    return path


def trace_file(trace_dir: str) -> str:
    """The newest *.xplane.pb under trace_dir (jax writes DIR/plugins/profile/<time>/<host>.xplane.pb)."""
    found = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not found:
        raise MissingInputError(f"no jax.profiler trace (*.xplane.pb) under {trace_dir!r}; take one with "
                                "experiments.bench --profile_dir=DIR or logging.profile_start")
    return max(found, key=os.path.getmtime)


def read_ops(path: str) -> list[OpTime]:
    """The executed instructions of an xplane.pb: a device plane's kernels where there is one, else the host's
    XLA:CPU instruction events (see the module docstring)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    device, host = [], []
    for plane in data.planes:
        on_device = plane.name.startswith("/device:")
        lines = list(plane.lines)
        if on_device:
            streams = [ln for ln in lines if ln.name.startswith("Stream")]
            lines = streams or [ln for ln in lines if ln.name == "XLA Ops"]
        elif not plane.name.startswith("/host:CPU"):
            continue
        for line in lines:
            for event in line.events:
                stats = dict(event.stats)
                if not on_device and "hlo_op" not in stats:
                    continue  # python frames, thread-pool bookkeeping
                op = OpTime(str(stats.get("hlo_module", "")), str(stats.get("hlo_op", event.name)), event.name,
                            float(event.start_ns), float(event.duration_ns))
                (device if on_device else host).append(op)
    return device or host


def _union_ns(ops: list[OpTime]) -> float:
    """Time during which at least one of `ops` ran."""
    total, end = 0.0, float("-inf")
    for op in sorted(ops, key=lambda o: o.start_ns):
        stop = op.start_ns + op.duration_ns
        if stop > end:
            total += stop - max(op.start_ns, end)
            end = stop
    return total


def summarize(trace_dir: str, top: int = 8) -> dict[str, Any]:
    """{"trace", "module", "classified_by", "seconds" and "share" per category, "busy_seconds" (time any kernel
    ran), "span_seconds" (first kernel's start to last's end), "top_other": the largest other instructions}."""
    path = trace_file(trace_dir)
    ops = read_ops(path)
    if not ops:
        raise MissingInputError(f"{path!r} holds no executed XLA instruction (was a step run inside the trace?)")
    per_module: dict[str, float] = {}
    for op in ops:
        per_module[op.module] = per_module.get(op.module, 0.0) + op.duration_ns
    module = max(per_module, key=per_module.get)
    ops = [op for op in ops if op.module == module]
    categories: dict[str, str] = {}
    for hlo_path in glob.glob(os.path.join(trace_dir, "*.hlo.txt")):
        name, found = hlo_categories(open(hlo_path).read())
        if name == module or not module:
            categories = found
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    other: dict[str, float] = {}
    counted = []
    for op in ops:
        category = categories.get(op.op) or name_category(op.op, op.kernel)
        if category == "control":
            continue
        counted.append(op)
        seconds[category] += op.duration_ns / 1e9
        if category == "other":
            other[op.op] = other.get(op.op, 0.0) + op.duration_ns / 1e9
    total = sum(seconds.values())
    return {"trace": path, "module": module, "classified_by": "hlo" if categories else "name",
            "seconds": seconds, "share": {c: (s / total if total else 0.0) for c, s in seconds.items()},
            "busy_seconds": _union_ns(counted) / 1e9,
            "span_seconds": (max(o.start_ns + o.duration_ns for o in counted) - min(o.start_ns for o in counted))
            / 1e9 if counted else 0.0,
            "top_other": [[name, s, s / total] for name, s in sorted(other.items(), key=lambda kv: -kv[1])[:top]]}


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['module']} ({s['trace']}; classified by {s['classified_by']})",
             "  " + ", ".join(f"{c} {s['share'][c] * 100:.1f}% ({s['seconds'][c] * 1e3:.1f} ms)" for c in CATEGORIES),
             f"  kernels busy {s['busy_seconds'] * 1e3:.1f} ms of a {s['span_seconds'] * 1e3:.1f} ms span"]
    lines += [f"  other: {name} {sec * 1e3:.2f} ms ({share * 100:.1f}%)" for name, sec, share in s["top_other"]]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    del argv
    summary = summarize(_TRACE_DIR.value, _TOP.value)
    print(json.dumps(summary) if _JSON.value else format_summary(summary))


if __name__ == "__main__":
    from experiments import cli

    _TRACE_DIR = flags.DEFINE_string("trace_dir", None, "A jax.profiler trace directory.")
    _JSON = flags.DEFINE_bool("json", False, "Print one JSON object only.")
    _TOP = flags.DEFINE_integer("top", 8, "How many of the largest other instructions to list.")
    flags.mark_flags_as_required(["trace_dir"])
    cli.run(main)

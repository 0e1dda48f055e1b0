"""XLA_FLAGS for the tests and the command lines they start: `devices` simulated CPU devices, and where the tests run
on the CPU alone (JAX_PLATFORMS unset or `cpu`) LLVM at its lowest optimisation level. The tests' models are tiny and
compiling them is most of their time (the compile-heavy files 23% faster on 2 cores); XLA's graph passes, and so what
is computed, are unchanged. On a GPU (`JAX_PLATFORMS=cuda,cpu`, .ci/gpu_check.sh) the tests compile as users do."""
import os


def xla_flags(devices: int) -> str:
    """The XLA_FLAGS value for `devices` simulated CPU devices."""
    flags = f"--xla_force_host_platform_device_count={devices}"
    cpu_only = os.environ.get("JAX_PLATFORMS", "cpu") == "cpu"
    return flags + " --xla_backend_optimization_level=0" if cpu_only else flags

"""XLA_FLAGS for the tests and the command lines they start: `devices` simulated CPU devices, and LLVM at its lowest
optimisation level. The tests' models are tiny and compiling them is most of their time (the compile-heavy files
23% faster on 2 cores); XLA's graph passes, and so what is computed, are unchanged."""


def xla_flags(devices: int) -> str:
    """The XLA_FLAGS value for `devices` simulated CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"

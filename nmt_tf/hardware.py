"""What the machine offers, for the choices made at start-up (--mixed_precision=auto)."""

from __future__ import annotations

import functools

# CPU flags (as /proc/cpuinfo names them) of bfloat16 arithmetic in hardware:
# AVX-512 BF16 (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids)
# and AMX-BF16 (Intel Sapphire Rapids and later). Without them TensorFlow
# emulates bfloat16 and mixed_bfloat16 is slower than float32.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def vector_flags() -> list[str]:
    """The flags that decide kernel speed (avx2, avx512*, amx*), sorted, for reports."""
    return sorted(f for f in cpu_flags() if f == "avx2" or f.startswith(("avx512", "amx")))


def resolve_precision(requested: str) -> tuple[str, str]:
    """(Keras dtype policy, why) for --mixed_precision=`requested`.

    "auto" is mixed_bfloat16 on a CPU with bfloat16 instructions and no GPU
    (1.3x the float32 training speed measured on an AMD EPYC with
    avx512_bf16, BUILD_NOTES.md), float32 everywhere else; a GPU gets
    float32 too (choose mixed_float16 or mixed_bfloat16 for it yourself).
    "none" is float32; the others are Keras' policies of the same name.
    """
    if requested != "auto":
        return ("float32" if requested == "none" else requested), f"--mixed_precision={requested}"
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "float32", "--mixed_precision=auto: float32, a GPU is visible (auto decides for CPUs only)"
    found = [f for f in BF16_CPU_FLAGS if f in cpu_flags()]
    if found:
        return "mixed_bfloat16", f"--mixed_precision=auto: mixed_bfloat16, this CPU has {' and '.join(found)}"
    return "float32", ("--mixed_precision=auto: float32, this CPU has no bfloat16 instructions "
                       f"({' or '.join(BF16_CPU_FLAGS)}), where bfloat16 would be emulated and slower")

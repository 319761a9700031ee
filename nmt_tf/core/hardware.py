"""What the machine offers, for the choices made at start-up
(--mixed_precision=auto in nmt_tf.core.precision, the CPU kernels of training,
the layout of training's step products)."""

from __future__ import annotations

import functools
import os
import platform
import sys

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


def bf16_cpu_flags() -> list[str]:
    """Which of BF16_CPU_FLAGS this CPU has (empty: no bfloat16 instructions).
    --mixed_precision=auto trains in bfloat16 where it is not empty, and
    `make train` chooses its recipe by it (the Makefile)."""
    return [f for f in BF16_CPU_FLAGS if f in cpu_flags()]


def vector_flags() -> list[str]:
    """The flags that decide kernel speed (avx2, avx512*, amx*), sorted, for reports."""
    return sorted(f for f in cpu_flags() if f == "avx2" or f.startswith(("avx512", "amx")))


# TensorFlow reads it once, when it is imported.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
_kernel_choice: str | None = None


def require_tensorflow_not_imported(caller: str) -> None:
    """Raises RuntimeError naming `caller` if TensorFlow is imported already:
    it reads TF_ENABLE_ONEDNN_OPTS then, and a later choice would be ignored."""
    if "tensorflow" in sys.modules:
        raise RuntimeError(f"{caller} must run before TensorFlow is imported")


def set_onednn(on: bool, caller: str) -> None:
    """Sets TF_ENABLE_ONEDNN_OPTS to turn TensorFlow's oneDNN CPU kernels on
    or off for this process (`caller`: who asks, for the error if too late)."""
    require_tensorflow_not_imported(caller)
    os.environ[ONEDNN_ENV] = "1" if on else "0"


def choose_training_kernels() -> str:
    """Turns on TensorFlow's oneDNN CPU kernels for training on x86 CPUs,
    unless TF_ENABLE_ONEDNN_OPTS says otherwise; returns what was chosen and
    why (for the training log: `training_kernels()` returns it again).

    On Linux, TensorFlow itself turns oneDNN on only on CPUs with AVX-512
    VNNI or bf16, AVX-VNNI or AMX, and runs Eigen's kernels elsewhere. For
    training, oneDNN was the faster of the two on both CPU kinds measured
    (BUILD_NOTES.md, "Training throughput"): an AMD EPYC with AVX-512
    (TensorFlow's default there already) and one with AVX2 only, where
    oneDNN trained 3-31 % faster in five pairs of runs.
    Serving makes its own choice (nmt_tf.serve --onednn). Must run before
    TensorFlow is imported, since TensorFlow reads the variable then.
    """
    global _kernel_choice
    caller = "choose_training_kernels()"
    require_tensorflow_not_imported(caller)
    user = os.environ.get(ONEDNN_ENV)
    if user is not None:
        # Values as TensorFlow's ReadBoolFromEnvVar reads them: "1" or "true" (any case) is on.
        kind = "oneDNN" if user.strip().lower() in ("1", "true") else "Eigen (no oneDNN)"
        _kernel_choice = f"CPU kernels: {kind}, as {ONEDNN_ENV}={user} in the environment asks."
    elif platform.machine().lower() in ("x86_64", "amd64", "i686", "i386"):
        set_onednn(True, caller)
        _kernel_choice = (f"CPU kernels: oneDNN, which trained faster than Eigen's on the AVX2 and AVX-512 "
                          f"CPUs measured (BUILD_NOTES.md; this CPU: {' '.join(vector_flags()) or 'no AVX2'}); "
                          f"{ONEDNN_ENV}=0 chooses Eigen.")
    else:
        _kernel_choice = f"CPU kernels: TensorFlow's default for {platform.machine() or 'this machine'}."
    return _kernel_choice


def training_kernels() -> str | None:
    """What `choose_training_kernels()` chose in this process, or None."""
    return _kernel_choice


def onednn_enabled() -> bool:
    """Whether this TensorFlow runs oneDNN's CPU kernels (TensorFlow decided
    when it was imported, from TF_ENABLE_ONEDNN_OPTS and the CPU)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):        # a private module: absent is "not known", i.e. no
        return False


@functools.lru_cache(maxsize=None)
def transposed_step_products() -> bool:
    """Whether training's time loops multiply by stored transposes of their
    step matrices (`nmt_tf.layers.ops.StepKernel`): with oneDNN on an AVX2
    CPU without AVX-512, where that product ran at 161-165 GFLOP/s against
    121 and the encoder's loop, forward and backward, took 4-20 % less time
    (BUILD_NOTES.md, "Where a training step's time goes"). Not with Eigen
    (62 against 156 GFLOP/s), and not on AVX-512 CPUs (an AMD Zen 4 trained
    5 % slower with them). Same numbers either way, to float32 rounding."""
    flags = cpu_flags()
    return "avx2" in flags and "avx512f" not in flags and onednn_enabled()


def step_products_choice() -> str:
    """`transposed_step_products()` as one line for the training log."""
    if transposed_step_products():
        return ("Time loops: products by stored transposes of the step matrices (oneDNN on an AVX2 CPU "
                "without AVX-512, where they are faster; BUILD_NOTES.md).")
    return "Time loops: products by the step matrices as stored."

"""A quiet first import of TensorFlow for the command-line tools.

Importing TensorFlow on a CPU machine prints C++ log lines before any tool
output: the oneDNN and CPU-instruction notices (INFO), "Could not find cuda
drivers" (INFO) and, at the first device probe, "failed call to cuInit:
UNKNOWN ERROR (303)" (ERROR). TF_CPP_MIN_LOG_LEVEL does not hide the INFO
lines, because TensorFlow writes them before its logging is initialised
("WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR"), and it cannot hide the cuInit line without hiding every
real error too. A new user reads them as failures.

`quiet_tensorflow_import()` (every tool calls it first, through
`nmt_tf.flags.start_cli`) makes the process's first `import tensorflow`,
wherever it happens, run with standard error (file descriptor 2) going
through a filter thread, followed by TensorFlow's device probe; then it
restores standard error:

- unless the user set TF_CPP_MIN_LOG_LEVEL, it is set to 1 (warnings and
  above) for the rest of the process, and INFO lines written before
  TensorFlow's logging started are dropped as that level would drop them
  (with their known second lines); with TF_CPP_MIN_LOG_LEVEL=0 nothing is
  dropped;
- the CUDA probe's lines (cudart_stub, cuInit) are held back until the
  probe is done and dropped when it found no GPU: they only say there is
  none;
- everything else (warnings, errors, Python's own output) is passed on as it
  comes, line by line.

- oneDNN's once-per-process notice that an op type falls back to Eigen
  ("oneDNN supports DT_INT64 only on platforms with AVX-512", printed as an
  ERROR the first time a graph holds such an op) is made to come now, by a
  tiny graph session, and dropped.

Later TensorFlow messages are not filtered.

While that import runs, scikit-learn looks missing (`_WithoutScikitLearn`):
Keras, which TensorFlow's import loads, would import it (and SciPy's
statistics) for its scikit-learn wrappers alone, about a second of every
tool's start; the tools import it themselves where they need it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import sys
import threading

_LOG_PREFIX = re.compile(r"^([IWEF])\d{4} ")                 # absl / glog: I1124 12:00:00.000 ...
_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# Known second lines of multi-line start-up messages.
_CONTINUATION = re.compile(r"^To enable the following instructions:")
# TensorFlow's oneDNN graph pass says this once per process, as an ERROR, the
# first time a graph holds an op it cannot run for that type (an int64
# Transpose does it even on AVX-512 machines): it only says Eigen runs the op.
_ONEDNN_FALLBACK = re.compile(r"oneDNN supports DT_\w+ only on platforms with AVX-512")
_CUDA_PROBE = re.compile(r"(cudart_stub\.cc|cuda_platform\.cc|cuda_executor\.cc|cuda_diagnostics\.cc)"
                         r"|failed call to cuInit|Could not find cuda drivers")


class LineFilter:
    """Decides line by line what reaches standard error during the import.

    `feed(line)` returns the lines to write now; `finish(gpu_found)` returns
    the held-back CUDA probe lines that still should be written."""

    def __init__(self, min_level: int):
        self.min_level = min_level
        self.held: list[str] = []
        self.dropping = False          # the last log line was dropped: so is its known continuation

    def feed(self, line: str) -> list[str]:
        if self.min_level <= 0:
            return [line]
        text = line.rstrip("\n")
        if text == _PREAMBLE:
            return []
        prefix = _LOG_PREFIX.match(text)
        if prefix is None:
            # The second line of a dropped message (cpu_feature_guard's), or
            # output of another kind, which goes through.
            if self.dropping and _CONTINUATION.match(text):
                return []
            self.dropping = False
            return [line]
        self.dropping = False
        if _ONEDNN_FALLBACK.search(text):
            return []
        if _CUDA_PROBE.search(text):
            self.held.append(line)
            self.dropping = True
            return []
        if prefix.group(1) == "I":
            self.dropping = True
            return []
        return [line]

    def finish(self, gpu_found: bool) -> list[str]:
        held, self.held = self.held, []
        return held if gpu_found else []


class _Capture:
    """Standard error (descriptor 2) through a LineFilter until `close(gpu_found)`."""

    def __init__(self):
        user_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
        if user_level is None:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
        try:
            min_level = int(user_level) if user_level is not None else 1
        except ValueError:
            min_level = 1
        self.filter = LineFilter(min_level)
        sys.stderr.flush()
        self.saved = os.dup(2)
        read_end, write_end = os.pipe()
        # Kept open for the life of the process: should a library have taken a
        # copy of the redirected descriptor, the thread goes on forwarding what
        # it writes, filtered, instead of leaving it to fill the pipe.
        self.out = os.fdopen(self.saved, "w")
        self.marker = f"--- nmt_tf: TensorFlow imported ({os.getpid()}) ---\n"
        self.drained = threading.Event()
        threading.Thread(target=self._forward, args=(read_end,), name="tensorflow-import-stderr",
                         daemon=True).start()
        os.dup2(write_end, 2)
        os.close(write_end)

    def _forward(self, read_end):
        with os.fdopen(read_end, "r", errors="replace") as pipe:
            for line in pipe:
                if line == self.marker:
                    self.drained.set()
                    continue
                for kept in self.filter.feed(line):
                    self.out.write(kept)
                    self.out.flush()
        self.drained.set()

    def close(self, gpu_found: bool):
        sys.stderr.flush()
        os.write(2, self.marker.encode())   # once the thread reads it, it has seen all before it
        self.drained.wait(timeout=5)
        os.dup2(self.saved, 2)
        for line in self.filter.finish(gpu_found):
            self.out.write(line)
        self.out.flush()


class _WithoutScikitLearn(importlib.abc.MetaPathFinder):
    """scikit-learn as missing while TensorFlow's import runs. That import
    loads Keras, and Keras imports scikit-learn (with SciPy's statistics)
    only for its scikit-learn wrappers, which then say it is not installed:
    about a second of every tool's start, for wrappers no tool uses. Later
    imports of scikit-learn (`nmt_tf.evaluation.representations`' t-SNE) find it as
    usual."""

    def find_spec(self, name, path=None, target=None):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ModuleNotFoundError(f"No module named {name!r} while TensorFlow loads (nmt_tf.core.startup)",
                                      name=name)
        return None


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with standard error captured (_Capture),
    followed by the device probe that prints the CUDA lines."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        try:
            capture = _Capture()
        except OSError:                  # no standard error to redirect
            return self.loader.exec_module(module)
        gpu_found = False
        deferred = _WithoutScikitLearn()
        sys.meta_path.insert(0, deferred)
        try:
            self.loader.exec_module(module)
            gpu_found = bool(module.config.list_physical_devices("GPU"))
            _say_onednn_fallbacks_now(module)
        finally:
            sys.meta_path[:] = [f for f in sys.meta_path if f is not deferred]
            capture.close(gpu_found)

    def __getattr__(self, name):         # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


def _say_onednn_fallbacks_now(tf) -> None:
    """Runs int64 and bool Transposes in a graph session of their own, so
    that oneDNN's once-per-process fallback notice comes while standard error
    is filtered, not in the middle of a tool's output. A v1 session leaves the
    eager context uninitialised: thread pools, logical CPU devices and
    collectives can still be configured afterwards. About 20 ms."""
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") in ("0", "false", "False"):
        return
    graph = tf.Graph()
    with graph.as_default():
        numbers = tf.compat.v1.placeholder(tf.int64, [1, 1])
        flags = tf.compat.v1.placeholder(tf.bool, [1, 1])
        transposed = [tf.transpose(numbers), tf.transpose(flags)]
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(transposed, {numbers: [[1]], flags: [[True]]})


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` with the other finders and hands it _QuietLoader (once)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorFlowFinder)]
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def quiet_tensorflow_import() -> None:
    """Makes the process's first `import tensorflow`, wherever it happens,
    run as the module docstring says (no import now: a tool that fails on its
    flags still answers at once). Nothing to do once TensorFlow is imported."""
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlowFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlowFinder())

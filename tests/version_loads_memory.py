"""Loads a SavedModel as N versions one after another through nmt_tf.serve's
ModelRegistry (each new version replacing the last), in a fresh process as a
server is one; prints the RSS growth over the last N loads, after 3 loads
that warm TensorFlow's own caches up.

  python tests/version_loads_memory.py SAVED_MODEL_DIR N
"""
import gc
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nmt_tf.serving.versions import ModelRegistry  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def main(path: str, loads: int) -> None:
    base = tempfile.mkdtemp()
    try:
        shutil.copytree(path, os.path.join(base, "1"))
        registry = ModelRegistry("nmt", base, log=lambda *a: None)
        registry.poll()

        def replace(version):
            shutil.copytree(path, os.path.join(base, str(version)))
            shutil.rmtree(os.path.join(base, str(version - 1)))
            registry.poll()
            assert registry.current.version == version, registry.failed

        for version in range(2, 5):
            replace(version)
        gc.collect()
        start = rss_mb()
        for version in range(5, 5 + loads):
            replace(version)
        gc.collect()
        print(f"start {start:.0f} MB, grown {rss_mb() - start:.1f} MB over {loads} loads", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

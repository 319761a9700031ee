"""Loads an nmt_tf SavedModel in a process where keras, keras_hub and nmt_tf
cannot be imported, and runs both signatures: what stock TF Serving needs.

TensorFlow probes for keras with importlib.util.find_spec at import time, so
the probe is answered, but any actual import of these packages fails.

  python tests/load_with_tensorflow_only.py SAVED_MODEL_DIR
"""
import importlib.abc
import importlib.machinery
import sys

BLOCKED = ("keras", "nmt_tf", "keras_hub", "tf_keras")


class Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"blocked import of {spec.name}")

    def exec_module(self, module):
        raise ImportError(f"blocked import of {module.__name__}")


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = Refuse()
            return spec
        return None


sys.meta_path.insert(0, Block())
import tensorflow as tf  # noqa: E402

# TF Serving links tensorflow-text's C++ op libraries, not its Python package
# (which imports keras): load the .so files the same way.
import glob  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402

spec = importlib.util.find_spec("tensorflow_text")
if spec is not None:
    for library in sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "python", "ops", "*.so"))):
        tf.load_op_library(library)

model = tf.saved_model.load(sys.argv[1])
out = model.signatures["serving_default"](text=tf.constant(["A man is walking his dog.", ""]))
assert out["translation"].shape == (2,)
print("translation ok", out["translation"].numpy())
scored = model.signatures["score"](source=tf.constant(["A man."]), target=tf.constant(["Un homme."]))
assert scored["log_prob"].shape == (1,)
print("score ok", scored["log_prob"].numpy())
print("imported:", sorted(k for k in sys.modules if k.split(".")[0] in BLOCKED))

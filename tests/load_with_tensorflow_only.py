"""Loads an nmt_tf SavedModel in a process where keras, keras_hub and nmt_tf
cannot be imported, and runs both signatures: what stock TF Serving needs.
It loads twice: as TF2 objects, and as tensorflow_model_server does (a TF1
session with the saver's restore op); both must give the same results.

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

path = sys.argv[1]
TEXT = ["A man is walking his dog.", ""]
PAIR = {"source": ["A man."], "target": ["Un homme."]}

# 1. TF2 object loading (nmt_tf.serve, tf.saved_model.load).
model = tf.saved_model.load(path)
out = model.signatures["serving_default"](text=tf.constant(TEXT))
assert out["translation"].shape == (2,)
print("translation ok", out["translation"].numpy())
scored = model.signatures["score"](**{k: tf.constant(v) for k, v in PAIR.items()})
assert scored["log_prob"].shape == (1,)
print("score ok", scored["log_prob"].numpy())

# 2. The way tensorflow_model_server loads it (tensorflow/cc/saved_model/
# loader.cc; `saved_model_cli run` does the same): import the MetaGraph into a
# TF1 graph, run the saver's restore op and the init op, then Session.run on
# the signature's tensor names. Variables that the restore op does not reach
# fail here, not in TF2 loading.
graph = tf.Graph()
with graph.as_default():
    session = tf.compat.v1.Session(graph=graph)
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)


def session_run(signature, feeds):
    sig = meta.signature_def[signature]
    return session.run({k: v.name for k, v in sig.outputs.items()},
                       {sig.inputs[k].name: v for k, v in feeds.items()})


by_session = session_run("serving_default", {"text": TEXT})
assert list(by_session["translation"]) == list(out["translation"].numpy()), by_session["translation"]
assert abs(by_session["score"] - out["score"].numpy()).max() < 1e-4
if "translate_constrained" in meta.signature_def:
    steer = {"text": TEXT, "target_prefix": ["Un homme", ""], "required_terms": ["chien", ""]}
    steered = model.signatures["translate_constrained"](**{k: tf.constant(v) for k, v in steer.items()})
    by_session_steered = session_run("translate_constrained", steer)
    assert list(by_session_steered["translation"]) == list(steered["translation"].numpy())
    assert steered["translation"].numpy()[0].startswith(b"Un homme"), steered["translation"]
    assert list(by_session_steered["terms_met"]) == list(steered["terms_met"].numpy())
    print("constrained ok", steered["translation"].numpy())
scored_by_session = session_run("score", PAIR)
assert abs(scored_by_session["log_prob"] - scored["log_prob"].numpy()).max() < 1e-4
print("session ok", by_session["translation"])
print("imported:", sorted(k for k in sys.modules if k.split(".")[0] in BLOCKED))

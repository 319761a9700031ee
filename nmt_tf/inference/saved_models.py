"""Loading nmt_tf's SavedModels: through TF2 (`load_saved_model`,
`load_signature`), or into a TF1 session of their own as
tensorflow_model_server does (`load_session`), with one-sentence errors
for a folder that is not a loadable export; `read_metadata` reads the
nmt_tf.json that nmt_tf.export writes beside it.
"""

from __future__ import annotations

import contextlib
import json
import os


def load_saved_model(path: str):
    """Loads an nmt_tf SavedModel, with tensorflow-text's ops registered first.

    Raises FileNotFoundError (one sentence) when `path` holds no SavedModel,
    or one that cannot be loaded (missing or damaged variables or assets, a
    damaged saved_model.pb).
    """
    import tensorflow as tf

    import nmt_tf.data.text  # noqa: F401  (it imports tensorflow_text, which registers the ops)

    with _loading(path):
        return tf.saved_model.load(path)


def load_session(path: str, config=None):
    """Loads a SavedModel into a TF1 session of its own, as tensorflow_model_server
    does (the "serve" meta graph, the saver's restore op, the init op); returns
    (session, its MetaGraphDef). Closing the session frees everything the
    version holds, which `tf.saved_model.load` does not (BUILD_NOTES.md,
    "Serving hardening"). Errors as load_saved_model's."""
    import tensorflow as tf

    import nmt_tf.data.text  # noqa: F401  (it imports tensorflow_text, which registers the ops)

    with _loading(path):
        graph = tf.Graph()
        with graph.as_default():
            session = tf.compat.v1.Session(graph=graph, config=config)
            try:
                meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
            except BaseException:
                session.close()
                raise
        return session, meta


@contextlib.contextmanager
def _loading(path: str):
    """Turns the errors of loading a SavedModel into one-sentence FileNotFoundErrors."""
    import tensorflow as tf

    if not os.path.exists(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(f"{path} is not a SavedModel version directory (no saved_model.pb in it)")
    try:
        yield
    except (tf.errors.OpError, ValueError, OSError, IndexError, RuntimeError) as e:   # missing variables, a cut file
        first = str(getattr(e, "message", e)).strip().splitlines()
        raise FileNotFoundError(f"{path} could not be loaded as a SavedModel ({type(e).__name__}: "
                                f"{first[0] if first else 'damaged'}); export it again") from e


EXPORT_METADATA = "nmt_tf.json"        # in a SavedModel's assets.extra/: written by nmt_tf.export


# nmt_tf.json's layout: 1 since nmt_tf 0.2.0; an export without the number is one of 0.1.0, read the same way.
METADATA_FORMAT = 1


def read_metadata(saved_model_dir: str) -> dict:
    """An export's nmt_tf.json; a ValueError for one a newer nmt_tf wrote."""
    path = os.path.join(saved_model_dir, "assets.extra", EXPORT_METADATA)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: {saved_model_dir} is not an nmt_tf export")
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    version = meta.get("format_version", 0) if isinstance(meta, dict) else None
    if not isinstance(version, int) or version > METADATA_FORMAT:
        raise ValueError(f"{path} has format_version {version!r}: the export was written by a newer nmt_tf (this "
                         f"one reads up to {METADATA_FORMAT}); upgrade nmt_tf to use it")
    return meta


def signature_defaults(path: str, name: str) -> dict:
    """The default values of a SavedModel signature's inputs, as Python
    numbers by input name (translate_with_options' search settings; TF
    Serving fills them in for a request that leaves them out, but a
    signature called in Python takes every input). {} for a signature
    without defaults; FileNotFoundError as load_saved_model's."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with _loading(path):
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            saved_model.ParseFromString(f.read())
    signature = saved_model.meta_graphs[0].signature_def.get(name) if saved_model.meta_graphs else None
    if signature is None:
        return {}
    return {alias: tf.make_ndarray(value).item() for alias, value in signature.defaults.items()}


def load_signature(path: str, name: str = "serving_default"):
    """One signature of an nmt_tf SavedModel (see `load_saved_model`)."""
    signatures = load_saved_model(path).signatures
    if name not in signatures:
        raise FileNotFoundError(f"{path} has no '{name}' signature; is it an nmt_tf export?")
    return signatures[name]

"""nmt_tf: attention-based neural machine translation (RNNsearch) in TensorFlow / Keras.

The Python API is `nmt_tf.Translator` (nmt_tf.api), e.g.
`nmt_tf.Translator.from_preset("multi30k_en_fr").translate(["A dog runs."])`;
the command-line tools are `python -m nmt_tf.<tool>` (README.md). Importing
the package itself loads nothing: the API's module is imported on first use.
"""

_API = ("Translator", "Translation", "PairScore")


def __getattr__(name):
    if name in _API:
        from nmt_tf import api

        return getattr(api, name)
    raise AttributeError(f"module 'nmt_tf' has no attribute {name!r}")

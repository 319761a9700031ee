"""The model architectures by their --model name, and building one from the flags.

Adding an architecture: its module here (a `Seq2SeqModel` subclass with a
`from_flags` class method, see `Seq2SeqModel.from_flags`), one entry in
`ARCHITECTURES`, and its row in README.md. The registry names modules rather
than importing them, so that nmt_tf.flags can take its --model choices from it
without importing TensorFlow.
"""

from __future__ import annotations

import importlib

# --model name -> (module, class).
ARCHITECTURES = {
    "rnnsearch": ("nmt_tf.models.rnnsearch", "RNNSearch"),      # Bahdanau et al. 2015 (paper 000)
    "rnnencdec": ("nmt_tf.models.rnnencdec", "RNNEncDec"),      # Cho et al. 2014a (paper 004), grConv 2014b (002)
}


def model_class(name: str):
    """The model class of --model=`name`; ValueError for an unknown name."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown --model={name}; choose one of {', '.join(ARCHITECTURES)}")
    module, cls = ARCHITECTURES[name]
    return getattr(importlib.import_module(module), cls)


def build_model(config, source_vocab_size: int, target_vocab_size: int):
    """The model named by --model, built from the flags in `config` (all
    weights created). Flag combinations the model cannot take are a
    ValueError naming the flags."""
    cls = model_class(config.model)
    cls.check_flags(config)
    model = cls.from_flags(config, source_vocab_size, target_vocab_size)
    model.build()
    return model

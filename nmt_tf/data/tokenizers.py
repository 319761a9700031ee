"""The tokenizers by their --tokenizer name.

Adding a tokenizer: a `nmt_tf.data.text.Tokenizer` subclass (how it cuts text into
tokens, joins them back, which tokens continue a word, and how it learns its
vocabularies from the training pairs), in nmt_tf/data/text.py or a module of its
own, and one entry in `TOKENIZERS`. The registry names classes rather than
importing them, so that nmt_tf.flags can take its --tokenizer choices from it
without importing TensorFlow (as nmt_tf.models does for --model).
"""

from __future__ import annotations

import importlib

# --tokenizer name -> (module, class).
TOKENIZERS = {
    "word": ("nmt_tf.data.text", "WordTokenizer"),                      # the paper's: Moses-like words, a shortlist
    "wordpiece": ("nmt_tf.data.text", "WordpieceTokenizer"),            # those words in WordPiece sub-words
    "sentencepiece": ("nmt_tf.data.text", "SentencepieceTokenizer"),    # SentencePiece pieces of the raw text
}


def tokenizer_class(name: str):
    """The tokenizer class of --tokenizer=`name`; ValueError for an unknown name."""
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")
    module, cls = TOKENIZERS[name]
    return getattr(importlib.import_module(module), cls)

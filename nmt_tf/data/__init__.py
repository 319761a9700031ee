"""Parallel corpora: reading and checking them, tokenization in TF ops
(text), vocabularies, the tf.data pipelines (pipeline), and word alignments
and lexical tables learned from them (alignment, lexicon)."""

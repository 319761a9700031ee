"""Translating with a trained model: beam and greedy search, lexical
constraints, the translation graph that the exports save as signatures,
restoring a model directory, calling a SavedModel or a server (client), and
the LiteRT runtime that needs no TensorFlow (litert_runtime)."""

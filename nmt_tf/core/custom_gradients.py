"""Letting go of the graphs that `tf.custom_gradient` pins.

Each time a function decorated with `tf.custom_gradient` is traced into a
graph (the token losses of `nmt_tf.models.training_step`; the step
products, the after-loop weight gradients and the layer normalisation of
`nmt_tf.layers.ops`), TensorFlow registers
its gradient under a new name, "CustomGradient-<uid>", in a process-wide
registry that nothing ever empties. The gradient function refers to tensors
of the traced graph, so that graph (the whole training step: about 26,000
Python objects for the tests' tiny model, and its C++ graph) lives as long
as the process, after the model and its functions are gone (TensorFlow
issues 27492 and 97697; TensorFlow 2.21 still does it).

A process that trains or exports more than once (a hyperparameter sweep in
a notebook, the test suite) then grows by those graphs every time: a tiny
model's training and export kept about 38,000 Python objects and 30 MB
each, and one test process held 1.6 million objects after 44 tests against
0.4 million at its start (BUILD_NOTES.md, "Test suite timings").

`released()` forgets, when its block ends, the custom gradients registered
inside it. Use it around work whose graphs are not differentiated again
afterwards: a training run or an export, not a model a caller goes on
training. `Registrations` does the same for an object's lifetime:
`nmt_tf.Translator` records what loading or tracing its model registers
and forgets it when the Translator is collected (each load of the shipped
model's SavedModel registered 69 and kept about 94,000 objects).

The registry is private to TensorFlow; if it is not where this looks for
it, nothing is forgotten (and nothing breaks).
"""

from __future__ import annotations

import contextlib

PREFIX = "CustomGradient-"


def _registry() -> dict | None:
    """TensorFlow's gradient registry (name -> entry), or None where it is not
    the private dictionary this module knows."""
    from tensorflow.python.framework import ops

    registry = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    return registry if isinstance(registry, dict) else None


def registered() -> set[str]:
    """The names of the custom gradients registered so far in this process."""
    registry = _registry()
    return {name for name in registry if name.startswith(PREFIX)} if registry is not None else set()


class Registrations:
    """The custom gradients registered inside this object's `recording()`
    blocks, forgotten together by `release()`. For an object that loads or
    traces graphs while it lives and lets them go when it is dropped
    (`nmt_tf.Translator`: `weakref.finalize(obj, registrations.release)`).
    As with `released`, a trace in another thread during a recording block
    is counted as the block's."""

    def __init__(self):
        self.names: set[str] = set()

    @contextlib.contextmanager
    def recording(self):
        before = registered()
        try:
            yield
        finally:
            self.names |= registered() - before

    def recorded(self, function):
        """`function`, each call of it a recording block."""
        def call(*args, **kwargs):
            with self.recording():
                return function(*args, **kwargs)
        return call

    def release(self):
        names, self.names = self.names, set()
        registry = _registry()
        if registry is not None:
            for name in names:
                registry.pop(name, None)


@contextlib.contextmanager
def released():
    """Forgets at the block's end the custom gradients registered within it,
    so that the graphs they were traced in can be garbage collected. Another
    thread tracing such a function at the same time would lose its gradient;
    training and exporting in one process are not made for that anyway (the
    dtype policy is process-wide)."""
    block = Registrations()
    try:
        with block.recording():
            yield
    finally:
        block.release()

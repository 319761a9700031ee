"""nmt_tf.core.custom_gradients: the graphs a block traced can be collected after it."""

import gc
import weakref

import pytest
import tensorflow as tf

from nmt_tf.core import custom_gradients
from nmt_tf.layers.ops import layer_norm


def _traced_layer_norm():
    """A new tf.function over layer_norm (a tf.custom_gradient), traced once;
    returns a weak reference to its graph."""
    gain, bias = tf.ones([4]), tf.zeros([4])
    function = tf.function(lambda x: layer_norm(x, gain, bias))
    return weakref.ref(function.get_concrete_function(tf.TensorSpec([None, 4])).graph)


def test_a_block_releases_the_custom_gradients_traced_in_it_and_their_graphs_go():
    outside = _traced_layer_norm()
    kept = custom_gradients.registered()
    with custom_gradients.released():
        inside = _traced_layer_norm()
        assert custom_gradients.registered() > kept          # the trace registered its gradient
    assert custom_gradients.registered() == kept              # only the block's are forgotten
    gc.collect()
    assert inside() is None                                   # its graph is garbage now
    # The premise: TensorFlow (2.21) keeps the other graph alive. A release that
    # stops doing so makes this module unnecessary, and this line says so.
    assert outside() is not None


def test_an_exception_in_the_block_releases_them_too():
    kept = custom_gradients.registered()
    with pytest.raises(KeyError), custom_gradients.released():
        _traced_layer_norm()
        raise KeyError("stop")
    assert custom_gradients.registered() == kept


def test_registrations_hold_what_their_recorded_calls_registered_until_released():
    owned = custom_gradients.Registrations()
    outside = _traced_layer_norm()
    kept = custom_gradients.registered()
    inside = owned.recorded(_traced_layer_norm)()
    assert owned.names and owned.names == custom_gradients.registered() - kept
    owned.release()
    assert custom_gradients.registered() == kept and not owned.names
    gc.collect()
    assert inside() is None and outside() is not None

"""Keras 3 layers of the papers' models (TensorFlow backend)."""

from nmt_tf.layers.attention import AdditiveAttention, masked_softmax
from nmt_tf.layers.decoder import AttentionDecoder
from nmt_tf.layers.gru import BidirectionalGRU, ConditionalGRUCell, gru_update
from nmt_tf.layers.initializers import BlockOrthogonal
from nmt_tf.layers.readout import MaxoutReadout

__all__ = [
    "AdditiveAttention", "AttentionDecoder", "BidirectionalGRU", "BlockOrthogonal",
    "ConditionalGRUCell", "MaxoutReadout", "gru_update", "masked_softmax",
]

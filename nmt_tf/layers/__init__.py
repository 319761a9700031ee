"""Keras 3 layers of the papers' models (TensorFlow backend)."""

from nmt_tf.layers.attention import AdditiveAttention, score_bias
from nmt_tf.layers.decoder import AttentionDecoder, CGRUDecoder, ContextDecoder
from nmt_tf.layers.grconv import GatedRecursiveConvolution
from nmt_tf.layers.gru import GRU, BidirectionalGRU, ConditionalGRUCell, GRUCell, TransitionGRUCell, gru_update
from nmt_tf.layers.initializers import BlockOrthogonal
from nmt_tf.layers.readout import MaxoutReadout

__all__ = [
    "AdditiveAttention", "AttentionDecoder", "BidirectionalGRU", "BlockOrthogonal", "CGRUDecoder",
    "ConditionalGRUCell", "ContextDecoder", "GRU", "GRUCell", "GatedRecursiveConvolution", "MaxoutReadout",
    "TransitionGRUCell", "gru_update", "score_bias",
]

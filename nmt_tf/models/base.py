"""Training logic shared by the encoder-decoder models.

A batch is ``(x, y)`` with ``x = {"source_ids": [B, Tx], "target_ids": [B, Ty]}``
(target_ids = [BOS] y_1 .. y_n, right-padded with 0) and ``y = [B, Ty]``
(y_1 .. y_n [EOS], right-padded with 0). Padding never contributes to the loss.

The objective is the mean negative log-likelihood of the target tokens of the
batch (paper 000 §4 trains on the NLL; the papers report it per sentence too,
and `train_summary.json` has both).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.text import PAD_ID


def token_nll(labels, logits):
    """Per-token negative log-likelihood and the real-token mask.

    Args:
      labels: [batch, Ty] int target ids, PAD_ID (0) at padding.
      logits: [batch, Ty, vocab] unnormalized scores (any float dtype).

    Returns:
      (nll [batch, Ty] float32, zero at padding; weights [batch, Ty] float32).
    """
    labels = tf.cast(labels, tf.int32)
    weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))
    return nll * weights, weights


class Seq2SeqModel(keras.Model):
    """A Keras model trained by `fit` on token-level NLL.

    Subclasses implement `call(inputs, training)` returning logits
    [batch, Ty, target_vocab] for teacher-forced decoding.

    Metrics (reset every epoch by Keras): `loss` is the NLL per target token
    over the epoch so far, `perplexity` its exponential. Each step also reports
    the batch's own values (`batch_*`) for TensorBoard and the throughput
    meter, and the global gradient norm before clipping.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.nll_sum = keras.metrics.Sum(name="nll_sum")
        self.target_token_count = keras.metrics.Sum(name="target_tokens")

    def batch_nll(self, x, y, training=False):
        """(sum of token NLL, number of target tokens, number of sentences) of a batch."""
        nll, weights = token_nll(y, self(x, training=training))
        return tf.reduce_sum(nll), tf.reduce_sum(weights), tf.cast(tf.shape(y)[0], tf.float32)

    def target_log_probs(self, x, y):
        """Forced decoding: log p(y_i | y_<i, x) of each target token.

        Returns [batch, Ty] float32, zero at padding; summing over the last
        axis gives log p(y | x) of each sentence.
        """
        nll, _ = token_nll(y, self(x, training=False))
        return -nll

    def _epoch_logs(self):
        loss = self.nll_sum.result() / tf.maximum(self.target_token_count.result(), 1.0)
        return {"loss": loss, "perplexity": tf.exp(loss)}

    def train_step(self, data):
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            nll_sum, tokens, sentences = self.batch_nll(x, y, training=True)
            loss = nll_sum / tf.maximum(tokens, 1.0)
            if self.losses:
                loss = loss + tf.add_n([tf.cast(l, tf.float32) for l in self.losses])
            scaled_loss = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled_loss, variables)
        scale = self.optimizer.scale_loss(tf.constant(1.0))
        grad_norm = tf.linalg.global_norm(gradients) / tf.cast(scale, tf.float32)
        self.optimizer.apply_gradients(zip(gradients, variables))
        self.nll_sum.update_state(nll_sum)
        self.target_token_count.update_state(tokens)
        return {**self._epoch_logs(), "batch_loss": loss, "batch_tokens": tokens,
                "batch_sentences": sentences, "grad_norm": grad_norm}

    def test_step(self, data):
        x, y = data[0], data[1]
        nll_sum, tokens, _ = self.batch_nll(x, y, training=False)
        self.nll_sum.update_state(nll_sum)
        self.target_token_count.update_state(tokens)
        return self._epoch_logs()

"""The training side of the encoder-decoder models: the objective and one update.

A batch is ``(x, y)`` with ``x = {"source_ids": [B, Tx], "target_ids": [B, Ty]}``
(target_ids = [BOS] y_1 .. y_n, right-padded with 0) and ``y = [B, Ty]``
(y_1 .. y_n [EOS], right-padded with 0). Padding never contributes to the loss.

The objective is the mean negative log-likelihood of the target tokens of the
batch (paper 000 §4 trains on the NLL, docs/SPEC.md §5; the papers report it per sentence too,
and `train_summary.json` has both); with `label_smoothing` = eps > 0 training
minimises (1 - eps) NLL + eps x (cross-entropy with the uniform distribution)
per token instead (Szegedy et al. 2016), while every reported loss and
perplexity stays the plain NLL. With R-drop (`rdrop_alpha` = alpha > 0;
Liang et al. 2021) an update runs its batch twice in one pass, each copy with
dropout masks of its own, and minimises the mean of the two copies' losses
plus alpha / 4 x (KL(p1 || p2) + KL(p2 || p1)) per target token: the R-drop
paper's L = L1 + L2 + alpha / 2 (KL + KL), halved, so that the loss and its
gradient stay on the scale of one copy's (what --clip_norm was set for) and
alpha means the paper's. The batch's token and sentence counts, and its NLL
(the two copies' mean), count each pair once.

`TrainingStep` is a part of `nmt_tf.models.base.Seq2SeqModel`: Keras'
`train_step` and `test_step` (under `tf.distribute` too), the batch NLL and
forced decoding; the token losses are functions here.
"""

from __future__ import annotations

import tensorflow as tf

from nmt_tf.data.text import PAD_ID


def token_losses(labels, logits, label_smoothing: float = 0.0):
    """Per-token NLL -log p(y), and with label smoothing eps > 0 also the
    training loss (1 - eps) (-log p(y)) + eps x mean over the vocabulary of
    (-log p(v)) = NLL + eps (logit_y - mean(logits)), from one softmax.

    No masking: every label counts (callers pass real tokens only, or mask).

    Args:
      labels: [...] int target ids.
      logits: [..., vocab] (any float dtype; computed in float32).
      label_smoothing: eps in [0, 1).

    Returns:
      nll [...] float32 when eps is 0, else (nll, loss), each [...] float32.
    """
    labels = tf.cast(labels, tf.int32)
    logits = tf.cast(logits, tf.float32)
    shape = tf.shape(labels)
    flat = _softmax_losses(tf.reshape(logits, [-1, tf.shape(logits)[-1]]), tf.reshape(labels, [-1]),
                           float(label_smoothing))
    return tf.nest.map_structure(lambda t: tf.reshape(t, shape), flat)


def _softmax_losses(logits, labels, eps: float):
    """`token_losses` of rows: logits [N, V] float32, labels [N] int32, with
    the gradient written out. With p = softmax(logits) and the one-hot o of
    the label,

        -log p(y)          = lse - logit_y,   lse = log sum_v exp(logit_v)
        d nll / d logits   = p - o
        d loss / d logits  = p - (1 - eps) o - eps / vocab

    lse comes from the softmax itself: p at the row's largest logit is
    1 / sum_v exp(logit_v - max), at least 1 / V, so lse = max - log(max p)
    loses nothing to underflow (-log p(y) taken as -log of a tiny p_y would).

    Why not tf.nn.sparse_softmax_cross_entropy_with_logits: its fused CPU
    kernel took 38-40 ms for [1,257 x 10,000] where oneDNN's softmax takes
    9-11 ms (AVX2 Zen 3, 2026-11-25). The loss and its gradient for a
    reference batch went from 54 ms (that op over all 1,520 positions) to 22
    ms (this, at the 1,257 real tokens) with oneDNN, 95 -> 78 ms with Eigen
    (BUILD_NOTES, "Where a training step's time goes"). And automatic
    differentiation of logit_y = gather(logits, y) would build a dense
    [N x vocab] gradient with an UnsortedSegmentSum; the one-hot part here
    is a scatter of one value per row."""
    vocab = tf.cast(tf.shape(logits)[-1], tf.float32)
    indices = tf.stack([tf.range(tf.shape(labels)[0]), labels], axis=1)

    @tf.custom_gradient
    def losses(logits):
        p = tf.nn.softmax(logits)
        lse = tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(p, axis=-1))
        label_logit = tf.gather(logits, labels, batch_dims=1)
        nll = lse - label_logit
        if not eps:
            return nll, lambda d_nll: tf.tensor_scatter_nd_sub(p * d_nll[:, None], indices, d_nll)
        loss = nll + eps * (label_logit - tf.reduce_mean(logits, axis=-1))

        def grad(d_nll, d_loss):
            d_nll = tf.zeros_like(nll) if d_nll is None else d_nll
            d_loss = tf.zeros_like(loss) if d_loss is None else d_loss
            grad_logits = p * (d_nll + d_loss)[:, None] - (eps / vocab) * d_loss[:, None]
            return tf.tensor_scatter_nd_sub(grad_logits, indices, d_nll + (1.0 - eps) * d_loss)

        return (nll, loss), grad

    # (benchmarks/profile_step.py counts the ops under this name as the loss.)
    with tf.name_scope("token_losses"):
        return losses(logits)


def real_token_weights(labels):
    """[batch, Ty] float32: 1 at real target tokens, 0 at padding (PAD_ID)."""
    return tf.cast(tf.not_equal(tf.cast(labels, tf.int32), PAD_ID), tf.float32)


def smoothed_token_losses(labels, logits, label_smoothing: float):
    """`token_losses` with label smoothing, masked: labels [batch, Ty] (PAD_ID
    at padding), logits [batch, Ty, vocab] -> (nll, loss), each [batch, Ty]
    float32, zero at padding."""
    weights = real_token_weights(labels)
    if not label_smoothing:
        nll = token_losses(labels, logits) * weights
        return nll, nll
    nll, loss = token_losses(labels, logits, label_smoothing)
    return nll * weights, loss * weights


def smoothed_token_loss(labels, logits, label_smoothing: float):
    """The training loss of `smoothed_token_losses` alone: [batch, Ty] float32, zero at padding."""
    return smoothed_token_losses(labels, logits, label_smoothing)[1]


def token_nll(labels, logits):
    """Per-token negative log-likelihood and the real-token mask.

    Args:
      labels: [batch, Ty] int target ids, PAD_ID (0) at padding.
      logits: [batch, Ty, vocab] unnormalized scores (any float dtype).

    Returns:
      (nll [batch, Ty] float32, zero at padding; weights [batch, Ty] float32).
    """
    weights = real_token_weights(labels)
    return token_losses(labels, logits) * weights, weights


def symmetric_kl(logits_a, logits_b):
    """KL(p || q) + KL(q || p) = sum over the vocabulary of (p - q)(log p - log q),
    with p = softmax(logits_a) and q = softmax(logits_b): [N, vocab] -> [N]
    float32 (R-drop's consistency term, differentiable in both)."""
    log_p = tf.nn.log_softmax(tf.cast(logits_a, tf.float32))
    log_q = tf.nn.log_softmax(tf.cast(logits_b, tf.float32))
    return tf.reduce_sum((tf.exp(log_p) - tf.exp(log_q)) * (log_p - log_q), axis=-1)


def _across_workers(strategy) -> bool:
    """A MultiWorkerMirroredStrategy with more than one worker (the condition
    under which Keras' TensorFlow trainer reduces step outputs across workers)."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())



class TrainingStep:
    """The training side of `Seq2SeqModel` (which it is a part of): uses the
    model's call, its `nll_sum` and `target_token_count` metrics, its
    optimizer and `label_smoothing`."""

    def batch_nll(self, x, y, training=False, return_loss=False):
        """(sum of token NLL, number of target tokens, number of sentences) of a
        batch; with `return_loss`, also the sum of the training loss per token
        (the NLL itself unless label smoothing or R-drop is on), from the same
        logits. The readout, output layer and loss run at the real target
        tokens only (`logits`' positions). With R-drop, in training with
        `return_loss`, the batch runs twice (see the module's docstring)."""
        labels = tf.cast(y, tf.int32)
        twice = bool(training and return_loss and self.rdrop_alpha)
        if twice:       # one pass over both copies; each row draws its own dropout masks
            x = tf.nest.map_structure(lambda t: tf.concat([t, t], axis=0), x)
            labels = tf.concat([labels, labels], axis=0)
        positions = tf.where(tf.not_equal(labels, PAD_ID))      # row-major: the first copy's tokens first
        logits = self(x, training=training, positions=positions)
        labels = tf.gather_nd(labels, positions)
        if return_loss and self.label_smoothing:
            nll, loss = token_losses(labels, logits, self.label_smoothing)
        else:
            nll = loss = token_losses(labels, logits)
        tokens = tf.shape(labels)[0]
        nll_sum, loss_sum = tf.reduce_sum(nll), tf.reduce_sum(loss)
        if twice:
            tokens //= 2
            consistency = symmetric_kl(logits[:tokens], logits[tokens:])
            nll_sum, loss_sum = nll_sum / 2, loss_sum / 2 + self.rdrop_alpha / 4 * tf.reduce_sum(consistency)
        out = (nll_sum, tf.cast(tokens, tf.float32), tf.cast(tf.shape(y)[0], tf.float32))
        if return_loss:
            out += (loss_sum,)
        return out

    def target_log_probs(self, x, y):
        """Forced decoding: log p(y_i | y_<i, x) of each target token.

        Returns [batch, Ty] float32, zero at padding; summing over the last
        axis gives log p(y | x) of each sentence.
        """
        nll, _ = token_nll(y, self(x, training=False))
        return -nll

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras 3.15's TensorFlow trainer, under a strategy, builds the model
        on the first batch of `fit`, averaged over the replicas by
        `strategy.reduce("MEAN", batch)`. MultiWorkerMirroredStrategy's reduce
        takes no dict of tensors, so `fit` fails there at once ("Attempt to
        convert a value ({'source_ids': PerReplica ...}) ... to a Tensor";
        multi-worker `fit` is reported broken in keras-team/keras#20585). The
        model is built before `fit`; the first replica's share of the batch
        serves to build the rest as well as a mean would."""
        if iterator is not None and self._distribute_strategy is not None:
            strategy = self._distribute_strategy
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tf.nest.map_structure(
                    lambda v: (strategy.experimental_local_results(v)[0]
                               if isinstance(v, tf.distribute.DistributedValues) else v), batch)
                break
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _epoch_logs(self, nll_sum=None, tokens=None):
        """Loss and perplexity of the epoch so far: from the metrics, or from
        the totals given (summed over a strategy's replicas)."""
        if nll_sum is None:
            nll_sum, tokens = self.nll_sum.result(), self.target_token_count.result()
        loss = nll_sum / tf.maximum(tokens, 1.0)
        return {"loss": loss, "perplexity": tf.exp(loss)}

    def train_step(self, data):
        """One update. Under a `tf.distribute` strategy each replica holds a
        share of the batch: the loss is normalised by the whole batch's target
        tokens, the replicas' gradients are summed here and clipped with the
        norm of that sum, so that the update is the one a single device makes
        on the whole batch (up to the order of floating-point sums)."""
        x, y = data[0], data[1]
        replica = tf.distribute.get_replica_context()
        replicas = replica.num_replicas_in_sync if replica is not None else 1
        with tf.GradientTape() as tape:
            nll_sum, tokens, sentences, loss_sum = self.batch_nll(x, y, training=True, return_loss=True)
            if replicas > 1:
                tokens = replica.all_reduce(tf.distribute.ReduceOp.SUM, tokens)
            loss = loss_sum / tf.maximum(tokens, 1.0)
            if self.losses:
                loss = loss + tf.add_n([tf.cast(l, tf.float32) for l in self.losses]) / replicas
            scaled_loss = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled_loss, variables)
        self.nll_sum.update_state(nll_sum)
        self.target_token_count.update_state(tokens / replicas)   # each replica adds its share
        # The optimizer itself, inside Keras' LossScaleOptimizer (mixed_float16).
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        takes_sums = getattr(optimizer, "accepts_global_norm", False)     # nmt_tf.training.optimizers
        if replicas > 1:
            if not takes_sums:
                raise ValueError("Training under a distribution strategy needs an optimizer of "
                                 f"nmt_tf.training.optimizers; got {type(optimizer).__name__}.")
            present = [i for i, g in enumerate(gradients) if g is not None]
            summed, (nll_sum, sentences, epoch_nll, epoch_tokens) = replica.all_reduce(
                tf.distribute.ReduceOp.SUM,
                ([tf.convert_to_tensor(gradients[i]) for i in present],
                 # (identity: under MultiWorkerMirroredStrategy a metric's result has no
                 # device in a traced step, and all_reduce needs one)
                 tuple(tf.identity(v) for v in (nll_sum, sentences, self.nll_sum.result(),
                                                self.target_token_count.result()))))
            for i, g in zip(present, summed):
                gradients[i] = g
            epoch_logs = self._epoch_logs(epoch_nll, epoch_tokens)
        else:
            epoch_logs = self._epoch_logs()
        scale = self.optimizer.scale_loss(tf.constant(1.0))
        grad_norm = tf.linalg.global_norm([g for g in gradients if g is not None]) / tf.cast(scale, tf.float32)
        # Keras increments optimizer.iterations with no data dependency on the
        # batch, so when get_next() hits the end of an epoch of unknown length
        # the increment still ran: one phantom step per epoch. Tie the whole
        # update to this batch.
        with tf.control_dependencies([grad_norm]):
            if takes_sums:
                # Clip with this norm instead of computing it again; do not sum again.
                with optimizer.given(global_norm=grad_norm, summed=replicas > 1):
                    self.optimizer.apply_gradients(zip(gradients, variables))
            else:
                self.optimizer.apply_gradients(zip(gradients, variables))
        logs = {**epoch_logs, "batch_loss": nll_sum / tf.maximum(tokens, 1.0), "batch_tokens": tokens,
                "batch_sentences": sentences, "grad_norm": grad_norm}
        if _across_workers(tf.distribute.get_strategy()):
            votes = getattr(self, "stop_votes", None)       # nmt_tf.training.callbacks.StopVotes
            if votes is not None:
                # The largest vote of each kind (all_reduce has no MAX: gather them).
                every = replica.all_gather(tf.reshape(tf.stack([votes.signal, votes.hours]), [1, 2]), axis=0)
                largest = tf.reduce_max(tf.reshape(every, [-1, 2]), axis=0)
                logs["stop_signal"], logs["stop_hours"] = largest[0], largest[1]
            # Keras averages a multi-worker step's outputs with strategy.reduce(MEAN, v,
            # axis=0), which fails on scalars: give it vectors of one value.
            logs = {k: tf.reshape(v, [1]) for k, v in logs.items()}
        return logs

    def test_step(self, data):
        x, y = data[0], data[1]
        nll_sum, tokens, _ = self.batch_nll(x, y, training=False)
        self.nll_sum.update_state(nll_sum)
        self.target_token_count.update_state(tokens)
        return self._epoch_logs()

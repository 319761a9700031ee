"""Training logic shared by the encoder-decoder models.

A batch is ``(x, y)`` with ``x = {"source_ids": [B, Tx], "target_ids": [B, Ty]}``
(target_ids = [BOS] y_1 .. y_n, right-padded with 0) and ``y = [B, Ty]``
(y_1 .. y_n [EOS], right-padded with 0). Padding never contributes to the loss.

The objective is the mean negative log-likelihood of the target tokens of the
batch (paper 000 §4 trains on the NLL, docs/SPEC.md §5; the papers report it per sentence too,
and `train_summary.json` has both); with `label_smoothing` = eps > 0 training
minimises (1 - eps) NLL + eps x (cross-entropy with the uniform distribution)
per token instead (Szegedy et al. 2016), while every reported loss and
perplexity stays the plain NLL.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from nmt_tf.layers import MaxoutReadout
from nmt_tf.layers.gru import FrozenRecurrentSplits
from nmt_tf.layers.initializers import weight_init
from nmt_tf.layers.ops import freeze_values, frozen_values, project
from nmt_tf.text import PAD_ID

# Search computes the output layer W_o t_i in this many column blocks (at
# most; fewer for a vocabulary smaller than that). Each block is its own
# matmul, so with one intra-op thread per op (nmt_tf.serve's default, the
# fastest setting for one-sentence requests) the executor's inter-op threads
# run the blocks in parallel instead of one thread doing the largest product
# of a step alone. The logits are the same either way.
OUTPUT_BLOCKS = 4

TIED_EMBEDDINGS = ("none", "target", "all")


def output_block_bounds(vocab_size, blocks: int = OUTPUT_BLOCKS) -> list[tuple]:
    """[(start, end)] column ranges of `blocks` near-equal blocks of the
    vocabulary; `vocab_size` may be a scalar tensor (a shortlist's width,
    known when the graph runs, and never below `blocks`), the bounds then
    tensors too."""
    if isinstance(vocab_size, int):
        blocks = max(1, min(blocks, vocab_size))
    edges = [vocab_size * i // blocks for i in range(blocks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def float32_norms(weights: dict) -> dict:
    """`weights` (a decoder's `step_weights()`, nested dicts) with every
    layer normalisation's (gain, bias), the entries named "..._norm", in
    float32: a bfloat16 search step then normalises in float32
    (`nmt_tf.layers.ops.layer_norm`), 3 % faster in batches of 80 on a Zen 4
    (BUILD_NOTES.md, "Decoding speed"). Training keeps its own bfloat16 ones."""
    return {key: (float32_norms(value) if isinstance(value, dict)
                  else tuple(tf.cast(w, tf.float32) for w in value) if key.endswith("_norm") else value)
            for key, value in weights.items()}


def by_sentence(rows, beam: int):
    """A search step's [batch * K, d] rows as [batch, K, d]; d stays static
    where it is known (a shortlist's width may be known only when the graph
    runs)."""
    width = rows.shape[-1] if rows.shape[-1] is not None else tf.shape(rows)[-1]
    return tf.reshape(rows, [-1, beam, width])


def count_parameters(*weights) -> int:
    """Total number of values in `weights`."""
    return sum(int(w.numpy().size) for w in weights)


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


def _across_workers(strategy) -> bool:
    """A MultiWorkerMirroredStrategy with more than one worker (the condition
    under which Keras' TensorFlow trainer reduces step outputs across workers)."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())


class Seq2SeqModel(keras.Model):
    """An encoder-decoder with the papers' deep output, trained by `fit` on token-level NLL.

    Holds what RNNsearch and RNNencdec share: the source and target word
    embeddings (N(0, 0.01^2)), the maxout readout and the output layer, and
    the options that are not in the papers: dropout (`dropout` on embeddings
    and maxout features; `annotation_dropout` on the encoder's outputs and
    `recurrent_dropout`, variational dropout of the GRU states, which
    subclasses apply), layer-normalised GRUs (`layer_norm`, also applied by
    subclasses; nmt_tf.layers.gru), tied embeddings and label smoothing.

    `tied_embeddings` (Press & Wolf 2017): "none" (the papers: an output
    matrix W_o of its own); "target": W_o = E_y^T, the target embeddings
    transposed (needs maxout_size == embedding_size; the output layer keeps
    only its bias); "all": also the source embeddings are E_y (one
    vocabulary for both sides, e.g. a joint SentencePiece model). Subclasses
    add an encoder and a decoder (`self.decoder`, with its own
    `step_weights()`) and implement

      call(inputs, training, positions=None) -> logits [batch, Ty, K_y]
          (teacher forcing; [N, K_y] at `positions` only, see `logits`),
      encode(source_ids) -> dict with "state" s_0 and per-sentence tensors,
      search_inputs(source_ids, weights) -> dict with "state" (search's
          decoder state [batch, d] for s_0: s_0 itself, or s_0 with products
          the next step needs) and the per-sentence tensors decode_step uses
          (encoder outputs and their products with step matrices, one row
          per sentence),
      decode_step(previous_ids [batch, K], state [batch, K, d], inputs, weights)
          -> (log-probs [batch, K, K_y], state [batch, K, d], alpha [batch, K, Tx]),

    which with `step_weights()` here is the interface of nmt_tf.search; search
    takes `step_weights()` and `search_inputs` once, outside its loop.

    Metrics (reset every epoch by Keras): `loss` is the NLL per target token
    over the epoch so far, `perplexity` its exponential. Each step also reports
    the batch's own values (`batch_*`) for TensorBoard and the throughput
    meter, and the global gradient norm before clipping.
    """

    def __init__(self, source_vocab_size: int, target_vocab_size: int, embedding_size: int,
                 hidden_size: int, maxout_size: int, dropout: float = 0.0, annotation_dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, layer_norm: bool = False, tied_embeddings: str = "none",
                 label_smoothing: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if tied_embeddings not in TIED_EMBEDDINGS:
            raise ValueError(f"tied_embeddings must be one of {', '.join(TIED_EMBEDDINGS)}, got {tied_embeddings!r}")
        if tied_embeddings != "none" and maxout_size != embedding_size:
            raise ValueError(f"tied embeddings need maxout_size == embedding_size (the output layer multiplies "
                             f"the {maxout_size} maxout units by the {embedding_size}-wide target embeddings)")
        if tied_embeddings == "all" and source_vocab_size != target_vocab_size:
            raise ValueError("tied_embeddings='all' needs one vocabulary for both sides, got sizes "
                             f"{source_vocab_size} and {target_vocab_size}")
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.maxout_size = maxout_size
        self.dropout = dropout
        self.annotation_dropout_rate = annotation_dropout
        self.recurrent_dropout = recurrent_dropout        # subclasses give both to their GRUs
        self.layer_norm = layer_norm
        self.tied_embeddings = tied_embeddings
        self.label_smoothing = label_smoothing
        self.target_embedding = keras.layers.Embedding(
            target_vocab_size, embedding_size, embeddings_initializer=weight_init(), name="target_embedding")
        self.source_embedding = self.target_embedding if tied_embeddings == "all" else keras.layers.Embedding(
            source_vocab_size, embedding_size, embeddings_initializer=weight_init(), name="source_embedding")
        self.readout = MaxoutReadout(maxout_size, name="readout")
        if tied_embeddings == "none":
            self.output_projection = keras.layers.Dense(
                target_vocab_size, kernel_initializer=weight_init(), name="output_projection")
        self.embedding_dropout = keras.layers.Dropout(dropout, name="embedding_dropout")
        self.readout_dropout = keras.layers.Dropout(dropout, name="readout_dropout")
        self.annotation_dropout = keras.layers.Dropout(annotation_dropout, name="annotation_dropout")
        self.nll_sum = keras.metrics.Sum(name="nll_sum")
        self.target_token_count = keras.metrics.Sum(name="target_tokens")

    @classmethod
    def from_model_config(cls, model_config, source_vocab_size: int, target_vocab_size: int):
        """The model of `model_config`, its architecture's configuration
        (nmt_tf.models; not built yet): each setting is the constructor
        argument of the same name."""
        return cls(source_vocab_size, target_vocab_size, **dataclasses.asdict(model_config))

    def build_shared(self, context_dim: int):
        """Creates the embeddings', readout's and output layer's weights."""
        self.source_embedding.build((None, None))
        self.target_embedding.build((None, None))
        self.readout.build_for(self.hidden_size, self.embedding_size, context_dim)
        if self.tied_embeddings == "none":
            self.output_projection.build((None, self.maxout_size))
        else:
            self.output_bias = self.add_weight(name="output_bias", shape=(self.target_vocab_size,),
                                               initializer="zeros")

    def output_weights(self):
        """(W_o [l, K_y], b [K_y]) of the output layer; W_o is E_y^T when tied
        (a transposed copy: for search, which takes it once)."""
        if self.tied_embeddings == "none":
            return self.output_projection.kernel, self.output_projection.bias
        return tf.transpose(self.target_embedding.embeddings), self.output_bias

    def step_weights(self) -> dict:
        """Matrices of one search step, split and cast to the compute dtype, that
        `decode_step` would otherwise rebuild at every step (copying megabytes):
        the target embeddings, the readout's U_o, V_o, b_o and C_o (in its
        `search_layout`, so the step's maxout takes two halves), the output
        layer's in `OUTPUT_BLOCKS` column blocks and the subclass's
        `self.decoder.step_weights()` (its layer normalisations' weights in
        float32 under bfloat16: `float32_norms`)."""
        frozen = frozen_values(self, "step_weights")
        if frozen is not None:
            return frozen
        dtype = self.compute_dtype
        kernel, bias = self.output_weights()
        bounds = output_block_bounds(self.target_vocab_size)
        return {"target_embedding": tf.cast(self.target_embedding.embeddings, dtype),
                "readout": self.readout.step_weights(),
                "readout_context": self.readout.search_context_kernel(),
                "output": [(tf.cast(kernel[:, a:b], dtype), tf.cast(bias[a:b], dtype)) for a, b in bounds],
                "decoder": self._search_decoder_weights()}

    def _search_decoder_weights(self) -> dict:
        """`self.decoder.step_weights()` as search takes them: under bfloat16
        with the layer normalisations' weights in float32 (`float32_norms`)."""
        weights = self.decoder.step_weights()
        return float32_norms(weights) if self.compute_dtype == "bfloat16" else weights

    def restrict_output(self, weights: dict, ids) -> dict:
        """`step_weights()` with the output layer cut to the columns of the
        target tokens `ids` ([C] int32, a vocabulary shortlist; C may be known
        only when the graph runs, and is at least `lexicon.SPECIALS`):
        search's log-probabilities are then over those C tokens, position c
        standing for ids[c]. Gathered from the model's own weights (rows of
        E_y when tied), in `OUTPUT_BLOCKS` near-equal blocks as the whole
        layer is."""
        dtype = self.compute_dtype
        kernel, bias = self.output_weights() if self.tied_embeddings == "none" else (None, self.output_bias)
        blocks = []
        for a, b in output_block_bounds(tf.shape(ids)[0]):
            part = ids[a:b]
            columns = (tf.gather(kernel, part, axis=1) if kernel is not None
                       else tf.transpose(tf.gather(self.target_embedding.embeddings, part)))
            blocks.append((tf.cast(columns, dtype), tf.cast(tf.gather(bias, part), dtype)))
        return {**weights, "output": blocks}

    def token_products(self) -> dict:
        """What a search step computes from the previous word's embedding alone,
        for every target word: "input", the decoder GRU's input term
        W E y + b [K_y, 3n] (layer-normalised with layer_norm), and
        "readout", V_o E y + b_o [K_y, 2l]. Two products of the whole
        embedding matrix (for the default Multi30k model 10,000 x 256 by
        256 x 2,048): worth it only when kept (`freeze_step_weights`)."""
        embeddings = tf.cast(self.target_embedding.embeddings, self.compute_dtype)
        return {"input": self.decoder.project_inputs(embeddings, self._search_decoder_weights()),
                "readout": self.readout.embedding_term(embeddings, self.readout.step_weights())}

    def freeze_step_weights(self, token_products: bool = True, output_layer: bool = True) -> list:
        """Builds `step_weights()` once and keeps the result as non-trainable
        tf.Variables, which `step_weights()` returns from then on instead of
        slicing, concatenating and reading the model's variables on every
        call. For exports (`nmt_tf.export --freeze_step_weights`), whose
        weights never change: a SavedModel then stores these matrices besides
        the model's own (the score signature still reads those), about 60%
        more bytes, and a one-sentence search no longer spends its first
        milliseconds copying them. The encoder's GRUs keep their recurrent
        matrices split the same way (`FrozenRecurrentSplits`; +6 MB for the
        Multi30k model). With `token_products`, `token_products()` is kept
        too (under "token_products", instead of the target embeddings, which
        search then no longer reads), and search steps look the previous
        words' terms up instead of multiplying their embeddings
        (`nmt_tf.export --freeze_token_products`; V x (3n + 2l - m) more
        values). Without `output_layer` the output layer's blocks are not kept
        (a search over a vocabulary shortlist gathers its own columns:
        `restrict_output`), and a search without a shortlist can no longer
        run. Returns the new variables (a SavedModel must track them).
        Training must not follow: the copies would not see weight updates."""
        weights = self.step_weights()
        if not output_layer:
            del weights["output"]
        if token_products:
            weights = {**weights, "token_products": self.token_products()}
            del weights["target_embedding"]
        variables = freeze_values(self, "step_weights", weights)
        for layer in self.layers:
            if isinstance(layer, FrozenRecurrentSplits):
                variables += layer.freeze_recurrent_splits()
        return variables

    def logits(self, states, previous_embeddings, contexts, training=False, positions=None):
        """Maxout readout and output layer: [..., n], [..., m], [..., context] -> [..., K_y] float32.

        With `positions` [N, 2] (the (sentence, step) of each real target
        token, `tf.where` of the labels), only those rows of [batch, Ty, ...]
        are computed: [N, K_y]. Training and validation skip the padding this
        way (8 % of the output layer's and readout's rows in the reference
        configuration's batches); the numbers at real positions are the same."""
        if positions is not None:
            states, previous_embeddings, contexts = (tf.gather_nd(t, positions)
                                                     for t in (states, previous_embeddings, contexts))
        features = self.readout(states, previous_embeddings, contexts)
        features = self.readout_dropout(features, training=training)
        if self.tied_embeddings == "none":
            return tf.cast(self.output_projection(features), tf.float32)
        # t_i E_y^T + b, without a transposed copy of E_y.
        return tf.cast(project(features, self.target_embedding.embeddings, self.output_bias,
                               transpose_kernel=True), tf.float32)

    def step_log_probs(self, state, embedding_term, readout_context, weights):
        """Search's output distribution: s_i [N, n], V_o E y_{i-1} + b_o [N, 2l]
        (`previous_word_terms`) and C_o c_i [N, 2l] -> log p(y_i | y_<i, x)
        [N, K_y] float32 (no dropout).

        The output layer is one product per column block of W_o (see
        `OUTPUT_BLOCKS`), joined before the softmax: the same numbers as one
        product, but independent ops that the executor can run side by side."""
        features = self.readout.step(state, embedding_term, readout_context, weights["readout"])
        blocks = [project(features, kernel, bias) for kernel, bias in weights["output"]]
        logits = blocks[0] if len(blocks) == 1 else tf.concat(blocks, axis=-1)
        return tf.nn.log_softmax(tf.cast(logits, tf.float32))

    def _search_step_inputs(self, previous_ids, state, weights):
        """decode_step's [batch, K] hypotheses as rows: (K (static), the terms
        of the previous words (`previous_word_terms`), the state [batch * K, d])."""
        beam = previous_ids.shape[1]
        if beam is None:
            raise ValueError("decode_step needs a static number of hypotheses per sentence")
        terms = self.previous_word_terms(tf.reshape(tf.cast(previous_ids, tf.int32), [-1]), weights)
        return beam, terms, tf.reshape(state, [-1, state.shape[-1]])

    def previous_word_terms(self, ids, weights):
        """A search step's terms of its previous words y_{i-1} (ids [N]):
        (W E y + b [N, 3n], the decoder GRU's input term, layer-normalised
        with layer_norm; V_o E y + b_o [N, 2l], the readout's), looked up in
        `weights["token_products"]` when an export froze them, computed from
        E y otherwise."""
        products = weights.get("token_products")
        if products is not None:
            return tf.gather(products["input"], ids), tf.gather(products["readout"], ids)
        embedded = tf.gather(weights["target_embedding"], ids)
        return (self.decoder.project_inputs(embedded, weights["decoder"]),
                self.readout.embedding_term(embedded, weights["readout"]))

    def embed_target(self, target_ids, training=False):
        return self.embedding_dropout(self.target_embedding(tf.cast(target_ids, tf.int32)), training=training)

    def embed_source(self, source_ids, training=False):
        return self.embedding_dropout(self.source_embedding(source_ids), training=training)

    def shared_parameter_groups(self) -> dict:
        """Parameter counts of the shared parts; a tied matrix counts once,
        with the target embedding."""
        output = (self.output_projection.weights if self.tied_embeddings == "none" else [self.output_bias])
        return {"source embedding": (0 if self.tied_embeddings == "all"
                                     else count_parameters(*self.source_embedding.weights)),
                "target embedding": count_parameters(*self.target_embedding.weights),
                "maxout readout": count_parameters(*self.readout.weights),
                "output layer": count_parameters(*output)}

    def get_config(self):
        return {**super().get_config(), "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, "embedding_size": self.embedding_size,
                "hidden_size": self.hidden_size, "maxout_size": self.maxout_size, "dropout": self.dropout,
                "annotation_dropout": self.annotation_dropout_rate, "recurrent_dropout": self.recurrent_dropout,
                "layer_norm": self.layer_norm, "tied_embeddings": self.tied_embeddings,
                "label_smoothing": self.label_smoothing}

    def batch_nll(self, x, y, training=False, return_loss=False):
        """(sum of token NLL, number of target tokens, number of sentences) of a
        batch; with `return_loss`, also the sum of the training loss per token
        (the NLL itself unless label smoothing is on), from the same logits.
        The readout, output layer and loss run at the real target tokens only
        (`logits`' positions)."""
        labels = tf.cast(y, tf.int32)
        positions = tf.where(tf.not_equal(labels, PAD_ID))
        logits = self(x, training=training, positions=positions)
        labels = tf.gather_nd(labels, positions)
        if return_loss and self.label_smoothing:
            nll, loss = token_losses(labels, logits, self.label_smoothing)
        else:
            nll = loss = token_losses(labels, logits)
        out = (tf.reduce_sum(nll), tf.cast(tf.shape(labels)[0], tf.float32), tf.cast(tf.shape(y)[0], tf.float32))
        if return_loss:
            out += (tf.reduce_sum(loss),)
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
        takes_sums = getattr(optimizer, "accepts_global_norm", False)     # nmt_tf.optimizers
        if replicas > 1:
            if not takes_sums:
                raise ValueError("Training under a distribution strategy needs an optimizer of "
                                 f"nmt_tf.optimizers; got {type(optimizer).__name__}.")
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
            votes = getattr(self, "stop_votes", None)       # nmt_tf.callbacks.StopVotes
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

"""What the encoder-decoder models share: `Seq2SeqModel`, their base class.

It holds the embeddings, the maxout readout and the output layer (the
papers' deep output, docs/SPEC.md §2), the options that are not in the
papers, and the interface subclasses implement. Its two other sides are
parts of their own: `TrainingStep` (nmt_tf.models.training_step: the
objective, `train_step`, `test_step`) and `SearchStep`
(nmt_tf.models.search_step: what a search step reads, and the export's
speed-ups of it).
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from nmt_tf.layers import MaxoutReadout
from nmt_tf.layers.initializers import weight_init
from nmt_tf.layers.ops import project
from nmt_tf.models import is_random_state
from nmt_tf.models.search_step import SearchStep
from nmt_tf.models.training_step import TrainingStep

TIED_EMBEDDINGS = ("none", "target", "all")


def count_parameters(*weights) -> int:
    """Total number of values in `weights`."""
    return sum(int(w.numpy().size) for w in weights)


class Seq2SeqModel(TrainingStep, SearchStep, keras.Model):
    """An encoder-decoder with the papers' deep output, trained by `fit` on token-level NLL.

    Holds what RNNsearch and RNNencdec share: the source and target word
    embeddings (N(0, 0.01^2)), the maxout readout and the output layer, and
    the options that are not in the papers: dropout (`dropout` on embeddings
    and maxout features; `source_word_dropout` / `target_word_dropout`, whole
    embedding vectors of source words and of the previous target words;
    `annotation_dropout` on the encoder's outputs and `recurrent_dropout`,
    variational dropout of the GRU states, which subclasses apply),
    layer-normalised GRUs (`layer_norm`, also applied by subclasses;
    nmt_tf.layers.gru), tied embeddings, label smoothing and R-drop
    (`rdrop_alpha`, nmt_tf.models.training_step).

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

    which with `step_weights()` here is the interface of nmt_tf.inference.search; search
    takes `step_weights()` and `search_inputs` once, outside its loop.

    Metrics (reset every epoch by Keras): `loss` is the NLL per target token
    over the epoch so far, `perplexity` its exponential. Each step also reports
    the batch's own values (`batch_*`) for TensorBoard and the throughput
    meter, and the global gradient norm before clipping.
    """

    def __init__(self, source_vocab_size: int, target_vocab_size: int, embedding_size: int,
                 hidden_size: int, maxout_size: int, dropout: float = 0.0, annotation_dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, source_word_dropout: float = 0.0,
                 target_word_dropout: float = 0.0, layer_norm: bool = False, tied_embeddings: str = "none",
                 label_smoothing: float = 0.0, rdrop_alpha: float = 0.0, transposed_products: bool = False,
                 **kwargs):
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
        self.rdrop_alpha = rdrop_alpha
        # Training's time loops multiply by stored transposes of their step matrices (the machine's choice,
        # nmt_tf.core.hardware.transposed_step_products, given by whoever builds the model; not a setting).
        self.transposed_products = transposed_products
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
        self.source_word_dropout_rate, self.target_word_dropout_rate = source_word_dropout, target_word_dropout
        # Whole words: one draw per token, the same for all m values of its embedding.
        self.source_word_dropout = keras.layers.Dropout(source_word_dropout, noise_shape=(None, None, 1),
                                                        name="source_word_dropout")
        self.target_word_dropout = keras.layers.Dropout(target_word_dropout, noise_shape=(None, None, 1),
                                                        name="target_word_dropout")
        self.nll_sum = keras.metrics.Sum(name="nll_sum")
        self.target_token_count = keras.metrics.Sum(name="target_tokens")

    @classmethod
    def from_model_config(cls, model_config, source_vocab_size: int, target_vocab_size: int,
                          transposed_products: bool = False):
        """The model of `model_config`, its architecture's configuration
        (nmt_tf.models; not built yet): each setting is the constructor
        argument of the same name."""
        return cls(source_vocab_size, target_vocab_size, transposed_products=transposed_products,
                   **dataclasses.asdict(model_config))

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

    def embed_target(self, target_ids, training=False):
        """E y for target ids [batch, Ty] (the previous words y_{i-1}), with
        word dropout and dropout in training: [batch, Ty, m]."""
        embedded = self.target_word_dropout(self.target_embedding(tf.cast(target_ids, tf.int32)), training=training)
        return self.embedding_dropout(embedded, training=training)

    def embed_source(self, source_ids, training=False):
        """E x for source ids [batch, Tx], with word dropout and dropout in
        training: [batch, Tx, m]."""
        embedded = self.source_word_dropout(self.source_embedding(source_ids), training=training)
        return self.embedding_dropout(embedded, training=training)

    def shared_parameter_groups(self) -> dict:
        """Parameter counts of the shared parts; a tied matrix counts once,
        with the target embedding."""
        output = (self.output_projection.weights if self.tied_embeddings == "none" else [self.output_bias])
        return {"source embedding": (0 if self.tied_embeddings == "all"
                                     else count_parameters(*self.source_embedding.weights)),
                "target embedding": count_parameters(*self.target_embedding.weights),
                "maxout readout": count_parameters(*self.readout.weights),
                "output layer": count_parameters(*output)}

    def dropout_random_states(self) -> list:
        """The random states of the model's dropout (one [2] int64 variable
        per dropout layer and per GRU with recurrent dropout, each advanced
        by every mask it draws), in the model's own order. Training
        checkpoints hold them, so that a resumed run draws the masks an
        uninterrupted one would."""
        return [v for v in self.variables if is_random_state(v.path)]

    def scale_dropout(self, factor: float) -> None:
        """Sets every dropout rate of the model to its configured rate times
        `factor` (1 restores them): the Dropout layers' and the recurrent
        dropout of every GRU and decoder. Traced functions keep the rates
        they were traced with, so the caller retraces the training function
        (nmt_tf/training/job.py, --early_dropout_epochs)."""
        configured = [(self.embedding_dropout, self.dropout), (self.readout_dropout, self.dropout),
                      (self.annotation_dropout, self.annotation_dropout_rate),
                      (self.source_word_dropout, self.source_word_dropout_rate),
                      (self.target_word_dropout, self.target_word_dropout_rate)]
        for layer, rate in configured:
            layer.rate = rate * factor
        for layer in self._flatten_layers(include_self=False):
            if hasattr(layer, "recurrent_dropout"):
                layer.recurrent_dropout = self.recurrent_dropout * factor

    def get_config(self):
        return {**super().get_config(), "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, "embedding_size": self.embedding_size,
                "hidden_size": self.hidden_size, "maxout_size": self.maxout_size, "dropout": self.dropout,
                "annotation_dropout": self.annotation_dropout_rate, "recurrent_dropout": self.recurrent_dropout,
                "source_word_dropout": self.source_word_dropout_rate,
                "target_word_dropout": self.target_word_dropout_rate,
                "layer_norm": self.layer_norm, "tied_embeddings": self.tied_embeddings,
                "label_smoothing": self.label_smoothing, "rdrop_alpha": self.rdrop_alpha}

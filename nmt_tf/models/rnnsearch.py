"""RNNsearch (Bahdanau, Cho & Bengio 2015): the attention-based translator.

    encoder:  h_j = [->h_j ; <-h_j], a bidirectional GRU over E_x x_j
              (with encoder_layers = L > 1, layer k > 1 reads layer k-1's
              h^(k-1) and gives h^(k) = h^(k-1) + BiGRU_k(h^(k-1)); h = h^(L))
    s_0     = tanh(W_s <-h_1 + b_s)
    decoder:  see nmt_tf.layers.decoder (attention, then GRU with context;
              with decoder="cgru" Nematus' conditional GRU: GRU, attention, GRU)
    readout:  t_i = maxout(U_o s_i + V_o E_y y_{i-1} + C_o c_i + b_o)
    output:   p(y_i | y_<i, x) = softmax(W_o t_i + b_o')

With the paper's sizes (m=620, n=1000, n'=1000, l=500, 30k vocabularies)
this model has 80.4 million parameters (docs/SPEC.md §2; `--dry_run` prints it).

Dropout (not in the paper, useful on small corpora): `dropout` on both
embeddings and on the maxout features t_i, `annotation_dropout` on the
annotations h_j (what the alignment model, the context vectors and s_0 see),
`recurrent_dropout` on the GRU states where they enter the recurrent
products (one mask per sentence, nmt_tf.layers.gru), during training only. Tied embeddings and label smoothing: see
`Seq2SeqModel`.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from nmt_tf.data.text import PAD_ID
from nmt_tf.layers import AttentionDecoder, BidirectionalGRU, CGRUDecoder, score_bias
from nmt_tf.layers.initializers import weight_init
from nmt_tf.models.base import Seq2SeqModel, count_parameters
from nmt_tf.models.search_step import by_sentence

# decoder= name -> its layer: the paper's, or Nematus' conditional GRU.
DECODERS = {"bahdanau": AttentionDecoder, "cgru": CGRUDecoder}


@keras.saving.register_keras_serializable(package="nmt_tf")
class RNNSearch(Seq2SeqModel):
    """The RNNsearch encoder-decoder.

    Args:
      source_vocab_size: K_x, rows of the source embedding (specials included).
      target_vocab_size: K_y, rows of the target embedding and outputs.
      embedding_size: m.
      hidden_size: n (per encoder direction, and the decoder state).
      attention_size: n', the alignment model's hidden size.
      maxout_size: l, the number of maxout units (the readout has 2l).
      dropout: dropout rate on embeddings and maxout features (training only).
      encoder_layers: L, bidirectional GRU layers in the encoder (paper: 1);
        layers above the first are residual (module docstring).
      decoder: "bahdanau" (the paper's, `AttentionDecoder`) or "cgru"
        (Nematus' conditional GRU, `CGRUDecoder`).
      decoder_transition_depth: GRUs per step of the cgru decoder (2, or
        more for a deep transition; `CGRUDecoder`'s transition_depth).
      **kwargs: annotation_dropout (on h_j), recurrent_dropout, layer_norm,
        tied_embeddings, label_smoothing (see `Seq2SeqModel`) and Keras' own.

    Inputs: {"source_ids": [batch, Tx] int, "target_ids": [batch, Ty] int},
    right-padded with 0.
    Output: logits [batch, Ty, K_y] float32; with `return_alignment=True`
    also the attention weights alpha [batch, Ty, Tx].
    """

    def __init__(self, source_vocab_size: int, target_vocab_size: int, embedding_size: int = 620,
                 hidden_size: int = 1000, attention_size: int = 1000, maxout_size: int = 500,
                 dropout: float = 0.0, encoder_layers: int = 1, decoder: str = "bahdanau",
                 decoder_transition_depth: int = 2, **kwargs):
        super().__init__(source_vocab_size, target_vocab_size, embedding_size, hidden_size, maxout_size,
                         dropout, **kwargs)
        if encoder_layers < 1:
            raise ValueError(f"encoder_layers must be at least 1, got {encoder_layers}")
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        if decoder_transition_depth != 2 and decoder != "cgru":
            raise ValueError(f"decoder_transition_depth={decoder_transition_depth} needs the cgru decoder")
        self.decoder_transition_depth = decoder_transition_depth
        self.decoder_type = decoder
        self.attention_size = attention_size
        self.encoder_layers = encoder_layers
        self.encoder = BidirectionalGRU(hidden_size, recurrent_dropout=self.recurrent_dropout,
                                        layer_norm=self.layer_norm, transposed_products=self.transposed_products,
                                        name="encoder")
        # Plain attributes encoder_2, ... (a checkpoint follows attributes), so
        # a one-layer model's checkpoints are what they were before layers.
        for k in range(2, encoder_layers + 1):
            setattr(self, f"encoder_{k}", BidirectionalGRU(
                hidden_size, recurrent_dropout=self.recurrent_dropout, layer_norm=self.layer_norm,
                transposed_products=self.transposed_products, name=f"encoder_{k}"))
        self.initial_state = keras.layers.Dense(
            hidden_size, activation="tanh", kernel_initializer=weight_init(), name="initial_state")
        depth = {"transition_depth": decoder_transition_depth} if decoder == "cgru" else {}
        self.decoder = DECODERS[decoder](hidden_size, attention_size, 2 * hidden_size,
                                         recurrent_dropout=self.recurrent_dropout, layer_norm=self.layer_norm,
                                         transposed_products=self.transposed_products, name="decoder", **depth)

    @classmethod
    def from_model_config(cls, model_config, source_vocab_size: int, target_vocab_size: int,
                          transposed_products: bool = False):
        return cls(source_vocab_size, target_vocab_size, name="rnnsearch", transposed_products=transposed_products,
                   **dataclasses.asdict(model_config))

    def build(self, input_shape=None):
        """Creates every weight from the sizes alone (no data needed)."""
        m, n = self.embedding_size, self.hidden_size
        self.build_shared(context_dim=2 * n)
        self.encoder.build((None, None, m))
        for layer in self.encoders[1:]:
            layer.build((None, None, 2 * n))
        self.initial_state.build((None, n))
        self.decoder.build((None, None, m))
        self.built = True

    @property
    def encoders(self) -> list:
        """The encoder's bidirectional GRU layers, bottom first."""
        return [self.encoder] + [getattr(self, f"encoder_{k}") for k in range(2, self.encoder_layers + 1)]

    def encode(self, source_ids, training=False, source_embeddings=None):
        """Runs the encoder.

        Args:
          source_ids: [batch, Tx] int, right-padded with 0.
          source_embeddings: their embeddings E x [batch, Tx, m] when the
            caller looked them up (a LiteRT export's host); outside training.

        Returns:
          dict with "annotations" [batch, Tx, 2n], "mask" [batch, Tx] bool,
          "state" s_0 [batch, n] and "keys" U_a h_j + b_a [batch, Tx, n'].
        """
        mask = tf.not_equal(source_ids, PAD_ID)
        # Outside training, the encoder's two directions run as two loops side
        # by side (BidirectionalGRU); training keeps its one batched loop.
        embedded = (self.embed_source(source_ids, training) if source_embeddings is None
                    else tf.cast(source_embeddings, self.compute_dtype))
        annotations = self.encoder(embedded, mask, separate_loops=not training, training=training)
        for layer in self.encoders[1:]:
            annotations = annotations + layer(annotations, mask, separate_loops=not training, training=training)
        annotations = self.annotation_dropout(annotations, training=training)
        state = self.initial_state(annotations[:, 0, self.hidden_size:])   # tanh(W_s <-h_1)
        return {"annotations": annotations, "mask": mask, "state": state,
                "keys": self.decoder.precompute(annotations)}

    @property
    def search_state_size(self) -> int:
        """Width d of search's decoder state: [s ; W_a s ; U_rz s] (n + n' + 2n),
        with the cGRU decoder [s ; U_1rz s] (3n)."""
        return self.decoder.search_state_size

    def search_inputs(self, source_ids, weights, source_embeddings=None):
        """`encode` for search: keys, the padding's score bias, the search
        state of s_0 (`AttentionDecoder.search_state`: s_0 with the products
        the first step needs) and the annotations projected once per sentence
        by [C | C_o] (the context's matrix in the decoder GRU and the
        readout's; see `AttentionDecoder.project_annotations`)."""
        encoded = self.encode(source_ids, source_embeddings=source_embeddings)
        projected = self.decoder.project_annotations(encoded["annotations"], weights["readout_context"],
                                                     weights["decoder"])
        # Keys in float32 whatever the compute dtype: a bfloat16 search then
        # scores in float32 (AdditiveAttention._attend), 3-7 % faster.
        return {"keys": tf.cast(encoded["keys"], tf.float32), "bias": score_bias(encoded["mask"]),
                "state": self.decoder.search_state(encoded["state"], weights["decoder"]),
                "projected_annotations": projected}

    def decode_step(self, previous_ids, state, inputs, weights=None):
        """One step of search for K hypotheses per sentence.

        Args:
          previous_ids: [batch, K] int, y_{i-1} ([BOS] at the first step); or
            their embeddings E y_{i-1} [batch, K, m] float, looked up by the
            caller (a LiteRT export's host: `_search_step_inputs`).
          state: [batch, K, d] search state of s_{i-1} (`search_state_size`: s
            with the products the step needs first, the decoder's `search_state`).
          inputs: `search_inputs`' dict, one row per sentence (never tiled:
            the K hypotheses of a sentence attend to its annotations together).
          weights: `step_weights()`, taken once outside the search loop
            (built here when None).

        Returns:
          (log p(y_i | y_<i, x) [batch, K, K_y] float32 (K_y: the shortlist's
           size when `weights` come from `restrict_output`), search state of s_i
           [batch, K, d], alpha_i [batch, K, Tx] float32).
        """
        weights = weights or self.step_weights()
        beam, (x_proj, embedding_term), state = self._search_step_inputs(previous_ids, state, weights)
        new_state, search_state, readout_context, alpha = self.decoder.step(
            x_proj, state, inputs["keys"], inputs["projected_annotations"], inputs["bias"],
            weights["decoder"], beam)
        log_probs = self.step_log_probs(new_state, embedding_term, readout_context, weights)
        return by_sentence(log_probs, beam), by_sentence(search_state, beam), alpha

    def call(self, inputs, training=False, return_alignment=False, positions=None):
        source_ids = tf.cast(inputs["source_ids"], tf.int32)
        encoded = self.encode(source_ids, training=training)
        previous = self.embed_target(inputs["target_ids"], training)
        states, contexts, alignments = self.decoder(
            previous, encoded["state"], encoded["annotations"], encoded["mask"], keys=encoded["keys"],
            training=training)
        logits = self.logits(states, previous, contexts, training=training, positions=positions)
        if return_alignment:
            return logits, alignments
        return logits

    def parameter_groups(self) -> dict:
        """Parameter counts by part of the model, in the order of docs/SPEC.md §2."""
        enc = self.encoder
        shared = self.shared_parameter_groups()
        upper = {f"encoder layer {k} GRUs": count_parameters(*layer.weights)
                 for k, layer in enumerate(self.encoders[1:], start=2)}
        return {
            "source embedding": shared["source embedding"],
            "target embedding": shared["target embedding"],
            "encoder forward GRU": count_parameters(*enc.direction_weights("forward")),
            "encoder backward GRU": count_parameters(*enc.direction_weights("backward")),
            **upper,
            **{name: count_parameters(*cell.weights) for name, cell in self.decoder.gru_cells().items()},
            "initial state s_0": count_parameters(*self.initial_state.weights),
            "attention": count_parameters(*self.decoder.attention.weights),
            "maxout readout": shared["maxout readout"],
            "output layer": shared["output layer"],
        }

    def get_config(self):
        return {**super().get_config(), "attention_size": self.attention_size,
                "encoder_layers": self.encoder_layers, "decoder": self.decoder_type,
                "decoder_transition_depth": self.decoder_transition_depth}

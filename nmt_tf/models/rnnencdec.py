"""RNN Encoder-Decoder, "RNNencdec" (Cho et al. 2014a, paper 004 §2; paper 000 §2.1),
with the GRU encoder or the gated recursive convolutional encoder of paper 002.

    encoder:  h_T, the last state of a GRU over E_x x_1..x_T           (encoder="rnn")
              or the root of a grConv over E_x x_1..x_T               (encoder="grconv")
    c       = tanh(V h_T + b_v)                      the fixed-length summary
    s_0     = tanh(V' c + b_v')
    decoder:  s_i = GRU(s_{i-1}, E_y y_{i-1}, c)     c enters all three gates
    readout:  t_i = maxout(U_o s_i + V_o E_y y_{i-1} + C_o c + b_o)
    output:   p(y_i | y_<i, x) = softmax(W_o t_i + b_o')

The decoder and readout are RNNsearch's with c in place of c_i, so the two
models differ only in how the source reaches the decoder (docs/SPEC.md §3). The grConv
root is summarized by the same c = tanh(V .) so that its decoder is exactly
RNNencdec's (paper 002 uses the RNNenc decoder for both); its nodes are not
used as annotations for attention. For grConv, the summary and state size n
is `hidden_size` for the decoder and `grconv_size` for the nodes (paper 002:
2,000 hidden units in the grConv, 1,000 in the RNNenc).

RNNencdec has no attention: `decode_step` reports an all-zero alignment, so
exported models keep the same outputs as RNNsearch with `alignment` zero.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from nmt_tf.data.text import PAD_ID
from nmt_tf.layers import GRU, ContextDecoder, GatedRecursiveConvolution
from nmt_tf.layers.initializers import weight_init
from nmt_tf.models.base import Seq2SeqModel, count_parameters
from nmt_tf.models.search_step import by_sentence

ENCODERS = ("rnn", "grconv")


@keras.saving.register_keras_serializable(package="nmt_tf")
class RNNEncDec(Seq2SeqModel):
    """The RNN Encoder-Decoder (optionally with a grConv encoder).

    Args:
      source_vocab_size, target_vocab_size, embedding_size, maxout_size,
        dropout: as for RNNSearch; **kwargs as for RNNSearch, where
        annotation_dropout applies to the summary c, and recurrent_dropout
        and layer_norm to the encoder GRU (not the grConv) and the decoder.
      hidden_size: n, the encoder GRU's and the decoder's state size, and the
        size of the summary c.
      encoder: "rnn" (a GRU) or "grconv".
      grconv_size: node size of the grConv (encoder="grconv").

    Inputs / outputs: as RNNSearch (no alignment).
    """

    def __init__(self, source_vocab_size: int, target_vocab_size: int, embedding_size: int = 620,
                 hidden_size: int = 1000, maxout_size: int = 500, dropout: float = 0.0,
                 encoder: str = "rnn", grconv_size: int = 2000, **kwargs):
        super().__init__(source_vocab_size, target_vocab_size, embedding_size, hidden_size, maxout_size,
                         dropout, **kwargs)
        if encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {encoder!r}; choose one of {', '.join(ENCODERS)}")
        self.encoder_type = encoder
        self.grconv_size = grconv_size
        self.encoder = (GRU(hidden_size, recurrent_dropout=self.recurrent_dropout, layer_norm=self.layer_norm,
                            transposed_products=self.transposed_products, name="encoder")
                        if encoder == "rnn" else GatedRecursiveConvolution(grconv_size, name="encoder"))
        self.summarizer = keras.layers.Dense(hidden_size, activation="tanh", kernel_initializer=weight_init(),
                                          name="summarizer")                   # c = tanh(V h_T)
        self.initial_state = keras.layers.Dense(hidden_size, activation="tanh", kernel_initializer=weight_init(),
                                                name="initial_state")          # s_0 = tanh(V' c)
        self.decoder = ContextDecoder(hidden_size, hidden_size, recurrent_dropout=self.recurrent_dropout,
                                      layer_norm=self.layer_norm, transposed_products=self.transposed_products,
                                      name="decoder")

    @property
    def encoder_output_size(self) -> int:
        return self.hidden_size if self.encoder_type == "rnn" else self.grconv_size

    @classmethod
    def from_model_config(cls, model_config, source_vocab_size: int, target_vocab_size: int,
                          transposed_products: bool = False):
        return cls(source_vocab_size, target_vocab_size, name=f"rnnencdec_{model_config.encoder}",
                   transposed_products=transposed_products, **dataclasses.asdict(model_config))

    def build(self, input_shape=None):
        """Creates every weight from the sizes alone (no data needed)."""
        m, n = self.embedding_size, self.hidden_size
        self.build_shared(context_dim=n)
        self.encoder.build((None, None, m))
        self.summarizer.build((None, self.encoder_output_size))
        self.initial_state.build((None, n))
        self.decoder.build((None, None, m))
        self.built = True

    def encode(self, source_ids, training=False, return_gates=False, source_embeddings=None):
        """Runs the encoder (`source_embeddings`: as RNNSearch.encode's).

        Returns dict with "context" c [batch, n], "context_proj" C c [batch, 3n],
        "state" s_0 [batch, n] and "mask" [batch, Tx]; with return_gates (grConv),
        also "gates" [Tx-1, batch, Tx-1, 3].
        """
        mask = tf.not_equal(source_ids, PAD_ID)
        embedded = (self.embed_source(source_ids, training) if source_embeddings is None
                    else tf.cast(source_embeddings, self.compute_dtype))
        gates = None
        if self.encoder_type == "rnn":
            _, last = self.encoder(embedded, mask, training=training)
        elif return_gates:
            last, gates = self.encoder(embedded, mask, return_gates=True)
        else:
            last = self.encoder(embedded, mask)
        context = self.annotation_dropout(self.summarizer(last), training=training)
        out = {"context": context, "context_proj": self.decoder.precompute(context),
               "state": self.initial_state(context), "mask": mask}
        if gates is not None:
            out["gates"] = gates
        return out

    @property
    def search_state_size(self) -> int:
        """Width d of search's decoder state: s itself (n)."""
        return self.hidden_size

    def search_inputs(self, source_ids, weights, source_embeddings=None):
        """`encode` for search, plus the readout's C_o c (c is the same at every
        step, so its product is taken once per sentence)."""
        encoded = self.encode(source_ids, source_embeddings=source_embeddings)
        readout_context = tf.matmul(tf.cast(encoded["context"], self.compute_dtype), weights["readout_context"])
        return {"context_proj": encoded["context_proj"], "readout_context": readout_context,
                "state": encoded["state"], "mask": encoded["mask"]}

    def decode_step(self, previous_ids, state, inputs, weights=None):
        """One step of search for K hypotheses per sentence (see RNNSearch.decode_step);
        the alignment is all zeros (no attention).

        `inputs` is `search_inputs`' dict; `weights` is `step_weights()`,
        taken once outside the search loop.
        """
        weights = weights or self.step_weights()
        beam, (x_proj, embedding_term), state = self._search_step_inputs(previous_ids, state, weights)
        per_row = lambda x: tf.repeat(x, beam, axis=0)          # [batch, d] -> [batch * K, d]
        new_state = self.decoder.step(x_proj, state, per_row(inputs["context_proj"]), weights["decoder"])
        log_probs = self.step_log_probs(new_state, embedding_term, per_row(inputs["readout_context"]), weights)
        alpha = tf.zeros(tf.concat([tf.shape(previous_ids)[:2], tf.shape(inputs["mask"])[1:]], 0), tf.float32)
        return (by_sentence(log_probs, beam),
                tf.reshape(new_state, [-1, beam, self.hidden_size]), alpha)

    def call(self, inputs, training=False, return_alignment=False, positions=None):
        source_ids = tf.cast(inputs["source_ids"], tf.int32)
        encoded = self.encode(source_ids, training=training)
        previous = self.embed_target(inputs["target_ids"], training)
        states = self.decoder(previous, encoded["state"], encoded["context"], training=training)
        context = tf.broadcast_to(tf.cast(encoded["context"], states.dtype)[:, None, :],
                                  tf.concat([tf.shape(states)[:2], [self.hidden_size]], 0))
        logits = self.logits(states, previous, context, training=training, positions=positions)
        if return_alignment:
            return logits, tf.zeros(tf.concat([tf.shape(states)[:2], tf.shape(source_ids)[1:]], 0))
        return logits

    def parameter_groups(self) -> dict:
        shared = self.shared_parameter_groups()
        return {
            "source embedding": shared["source embedding"],
            "target embedding": shared["target embedding"],
            f"encoder ({self.encoder_type})": count_parameters(*self.encoder.weights),
            "summary c": count_parameters(*self.summarizer.weights),
            "decoder GRU": count_parameters(*self.decoder.weights),
            "initial state s_0": count_parameters(*self.initial_state.weights),
            "maxout readout": shared["maxout readout"],
            "output layer": shared["output layer"],
        }

    def get_config(self):
        return {**super().get_config(), "encoder": self.encoder_type, "grconv_size": self.grconv_size}

"""The search side of the encoder-decoder models: what a beam-search step
reads from a model (nmt_tf.inference.search's interface with it), and the export's
speed-ups of it.

`SearchStep` is a part of `nmt_tf.models.base.Seq2SeqModel`. It gives
search the matrices of one step, split and cast once (`step_weights`), the
step's output distribution (`step_log_probs`, the output layer in
`OUTPUT_BLOCKS` column blocks) and the previous words' terms
(`previous_word_terms`). For an export (nmt_tf.exporting.saved_model), whose weights
never change, `freeze_step_weights` keeps those matrices, and the products
of every target word's embedding (`token_products`), as variables of their
own; `restrict_output` cuts the output layer to a vocabulary shortlist.
"""

from __future__ import annotations

import tensorflow as tf

from nmt_tf.layers.gru import FrozenRecurrentSplits
from nmt_tf.layers.ops import freeze_values, frozen_values, project

# Search computes the output layer W_o t_i in this many column blocks (at
# most; fewer for a vocabulary smaller than that). Each block is its own
# matmul, so with one intra-op thread per op (nmt_tf.serve's default, the
# fastest setting for one-sentence requests) the executor's inter-op threads
# run the blocks in parallel instead of one thread doing the largest product
# of a step alone. The logits are the same either way.
OUTPUT_BLOCKS = 4


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


class SearchStep:
    """The search side of `Seq2SeqModel` (which it is a part of): uses the
    model's embeddings, readout, output layer and `self.decoder`."""

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

    def _search_step_inputs(self, previous, state, weights):
        """decode_step's [batch, K] hypotheses as rows: (K (static), the terms
        of the previous words (`previous_word_terms`), the state [batch * K, d]).
        `previous`: their ids [batch, K], or their embeddings E y [batch, K, m]
        (float) when the caller looked them up (a LiteRT export: the host
        reads them from the tied output layer, nmt_tf.exporting.litert)."""
        beam = previous.shape[1]
        if beam is None:
            raise ValueError("decode_step needs a static number of hypotheses per sentence")
        if previous.dtype.is_floating:
            embedded = tf.cast(tf.reshape(previous, [-1, previous.shape[-1]]), self.compute_dtype)
            terms = self.embedded_word_terms(embedded, weights)
        else:
            terms = self.previous_word_terms(tf.reshape(tf.cast(previous, tf.int32), [-1]), weights)
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
        return self.embedded_word_terms(tf.gather(weights["target_embedding"], ids), weights)

    def embedded_word_terms(self, embedded, weights):
        """`previous_word_terms` of the embeddings E y [N, m] themselves."""
        return (self.decoder.project_inputs(embedded, weights["decoder"]),
                self.readout.embedding_term(embedded, weights["readout"]))

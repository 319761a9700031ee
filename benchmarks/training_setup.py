"""What the training benchmarks share: the pipeline and the compiled model of `nmt_tf.train`."""

from __future__ import annotations

import tempfile


def compiled_model_and_data(config):
    """(training dataset of one epoch, compiled model with its optimizer built)
    from the flags in `config`, as `nmt_tf.train` makes them; vocabularies are
    learned into a temporary directory."""
    from nmt_tf.data import pipeline as data
    from nmt_tf.training import job as training

    with tempfile.TemporaryDirectory() as tmp:
        src_tok, tgt_tok, _ = data.build_vocabularies(config, tmp, log=lambda *a: None)
    ds = data.make_dataset(config.train_src, config.train_tgt, src_tok, tgt_tok,
                           max_len=config.max_len, batch_size=config.batch_size,
                           batch_type=config.batch_type, pool_size=config.pool_size,
                           shuffle=True, shuffle_buffer=config.shuffle_buffer, seed=config.seed)
    model = training.build_model(config, src_tok.vocab_size, tgt_tok.vocab_size)
    model.compile(optimizer=training.make_optimizer(config), jit_compile=config.jit_compile)
    # As nmt_tf.train does: an XLA-compiled step cannot create the optimizer's variables.
    model.optimizer.build(model.trainable_variables)
    return ds, model

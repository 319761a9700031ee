"""Training with Keras `model.fit`: the job (job.train), its callbacks,
optimizers, learning-rate schedules, tf.distribute strategies and
fine-tuning from a trained model or preset."""

"""Writing a trained model for serving: a SavedModel version
(saved_model) and a LiteRT model folder (litert)."""

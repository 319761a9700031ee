"""Translation quality and the papers' analyses: BLEU and chrF (metrics),
scoring a model against references (quality), learned representations,
attention pictures and plots."""

"""The model architectures by their --model name, each with its configuration.

Adding an architecture takes two files: its module here (a `Seq2SeqModel`
subclass with a `from_model_config` class method that builds it from its model
configuration), and in this file its configuration (a `ModelConfig`
subclass with the settings it adds, each one a --flag of nmt_tf.train)
and its entry in `ARCHITECTURES` (which gives --model its choices); then its
row in README.md. The registry names modules rather than importing them, so
that nmt_tf.config and nmt_tf.flags can read it without importing
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import NamedTuple

from nmt_tf.core.settings import ConfigError, check_limits, setting

# Every dropout rate of ModelConfig: what --early_dropout_epochs scales
# (Seq2SeqModel.scale_dropout), and what R-drop needs one of.
DROPOUT_RATES = ("dropout", "annotation_dropout", "recurrent_dropout", "source_word_dropout", "target_word_dropout")


def has_dropout(config) -> bool:
    """Whether any of `config`'s DROPOUT_RATES is above 0 (a ModelConfig or
    a whole nmt_tf.config.TrainingConfig; both have every rate)."""
    return any(getattr(config, name) for name in DROPOUT_RATES)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The settings every architecture takes (their flags are nmt_tf.train's);
    the defaults are the paper's (m = 620, n = 1000, l = 500)."""

    embedding_size: int = setting('integer', 620,
            "Word embedding size m (paper: 620).", lower=1)
    hidden_size: int = setting('integer', 1000,
            "GRU state size n, per encoder direction and in the decoder (paper: 1000).", lower=1)
    maxout_size: int = setting('integer', 500,
            "Number of maxout units l of the deep output (paper: 500).", lower=1)
    dropout: float = setting('float', 0.0,
            "Dropout rate on embeddings and maxout features during training (paper: none).", lower=0.0, upper=0.95)
    annotation_dropout: float = setting('float', 0.0,
            "Dropout rate on the encoder's outputs during training: RNNsearch's annotations h_j, "
            "RNNencdec's summary c (paper: none; nmtpytorch's Multi30k recipes: 0.5).", lower=0.0, upper=0.95)
    recurrent_dropout: float = setting('float', 0.0,
            "Variational dropout of the GRU states in training (Gal & Ghahramani 2016; Nematus' "
            "dropout_hidden, Marian's dropout-rnn): one mask per sentence, the same at every step, where "
            "the state enters the recurrent products (paper: none).", lower=0.0, upper=0.95)
    source_word_dropout: float = setting('float', 0.0,
            "Word dropout on the source side in training: each source token's whole embedding vector is "
            "zeroed with this probability, the kept ones scaled by 1 / (1 - p) (Sennrich et al. 2016; "
            "Nematus' dropout_source, Marian's dropout-src; paper: none).", lower=0.0, upper=0.95)
    target_word_dropout: float = setting('float', 0.0,
            "Word dropout on the target side in training: the embedding of the previous target word "
            "y_{i-1}, as the decoder and the readout read it, is zeroed with this probability per "
            "position, the kept ones scaled by 1 / (1 - p) (Nematus' dropout_target, Marian's "
            "dropout-trg; paper: none).", lower=0.0, upper=0.95)
    layer_norm: bool = setting('boolean', False,
            "Layer-normalised GRUs (Ba et al. 2016, as Nematus and Marian use them): the input, recurrent"
            " and context terms of the gates and of the candidate each normalised on their own, with a "
            "gain and a bias (paper: none).")
    tied_embeddings: str = setting('enum', 'none',
            "Weight tying (Press & Wolf 2017; paper: none): target: the output layer is the transposed "
            "target embedding matrix (needs --maxout_size equal to --embedding_size); all: the source "
            "embeddings are that matrix too (needs --joint_vocabulary).", choices=['none', 'target', 'all'])
    label_smoothing: float = setting('float', 0.0,
            "Label smoothing eps of the training loss: (1 - eps) NLL + eps x cross-entropy with the "
            "uniform distribution (paper: 0). Reported losses and perplexities stay the plain NLL.", lower=0.0, upper=0.5)
    rdrop_alpha: float = setting('float', 0.0,
            "R-drop (Liang et al. 2021; paper: none): with alpha > 0 every update runs its batch twice in one "
            "pass, each copy with its own dropout masks, and trains on the mean of the two copies' losses plus "
            "alpha / 4 x (KL(p1||p2) + KL(p2||p1)) of their word distributions, per target token: the R-drop "
            "paper's objective halved, so alpha is its alpha (5 in its translation runs). Twice the "
            "computation per update; needs dropout. 0: off.", lower=0.0, upper=100.0)

    def __post_init__(self):
        check_limits(self)
        if self.rdrop_alpha and not has_dropout(self):
            raise ConfigError(f"--rdrop_alpha={self.rdrop_alpha} needs dropout, and every rate is 0 "
                              f"({', '.join('--' + name for name in DROPOUT_RATES)}): without it the two copies "
                              "of a batch give the same distributions, and R-drop would only double each "
                              "update's work.")
        if self.tied_embeddings != "none" and self.maxout_size != self.embedding_size:
            raise ConfigError(f"--tied_embeddings={self.tied_embeddings} needs --maxout_size equal to "
                              f"--embedding_size (now {self.maxout_size} and {self.embedding_size}): the "
                              "output layer multiplies the maxout units by the target embeddings.")

    def refuse(self, given: dict) -> None:
        """ConfigError for a setting of another architecture that, given to
        this one, signals a mistake (`given`: name -> value, of the settings
        this architecture does not take that differ from their defaults).
        Others are ignored: a flagfile may hold the sizes of several."""

    def describe(self) -> str:
        """The architecture in a few words with its papers, for people (the
        translation page shows it)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class RNNSearchConfig(ModelConfig):
    """RNNsearch (Bahdanau et al. 2015, paper 000): a bidirectional GRU encoder and attention."""

    attention_size: int = setting('integer', 1000,
            "Hidden size n' of the alignment model (paper: 1000).", lower=1)
    encoder_layers: int = setting('integer', 1,
            "Layers of bidirectional GRUs in RNNsearch's encoder (paper: 1). Each layer above the first reads the"
            " annotations of the layer below and adds its own to them (a residual connection); the top "
            "layer's are the annotations h_j.", lower=1, upper=8)
    decoder: str = setting('enum', 'bahdanau',
            "RNNsearch's decoder: bahdanau (the paper's: the attention reads s_{i-1}, one GRU reads E y_{i-1}"
            " and c_i) or cgru (Nematus' conditional GRU, Sennrich et al. 2017: a first GRU reads E y_{i-1}, "
            "the attention reads its state, a second GRU reads c_i; n x 3n more weights and one more "
            "[n, 3n] product per step).", choices=['bahdanau', 'cgru'])
    decoder_transition_depth: int = setting('integer', 2,
            "GRUs per step of the cgru decoder (Nematus' dec_base_recurrence_transition_depth): 2 is the "
            "conditional GRU's two; each one more adds a GRU without input after the second, a deep transition "
            "(Miceli Barone et al. 2017) of n x 3n + 3n weights and two state products per step.",
            lower=2, upper=8)

    def __post_init__(self):
        super().__post_init__()
        if self.decoder_transition_depth != 2 and self.decoder != "cgru":
            raise ConfigError(f"--decoder_transition_depth={self.decoder_transition_depth} needs --decoder=cgru: "
                              "the paper's decoder has one GRU per step.")

    def describe(self) -> str:
        parts = ["RNNsearch with attention (Bahdanau et al. 2015)"]
        if self.decoder == "cgru":
            deep = f" with a deep transition of {self.decoder_transition_depth} GRUs" * (
                self.decoder_transition_depth > 2)
            parts.append(f"a conditional GRU decoder (Sennrich et al. 2017){deep}")
        if self.encoder_layers > 1:
            parts.append(f"{self.encoder_layers} encoder layers")
        return ", ".join(parts)

    def refuse(self, given: dict) -> None:
        if given.get("encoder", "rnn") != "rnn":
            raise ConfigError("--encoder=grconv goes with --model=rnnencdec; RNNsearch always uses its "
                              "bidirectional GRU.")


@dataclasses.dataclass(frozen=True)
class RNNEncDecConfig(ModelConfig):
    """RNNencdec (Cho et al. 2014a, paper 004): a fixed-length summary of the
    source, from a GRU or a grConv encoder (Cho et al. 2014b, paper 002)."""

    encoder: str = setting('enum', 'rnn',
            "Encoder of --model=rnnencdec: rnn (a GRU) or grconv (gated recursive convolution, Cho et al."
            " 2014b). RNNsearch always uses its bidirectional GRU.", choices=['rnn', 'grconv'])
    grconv_size: int = setting('integer', 2000,
            "Node size of the grConv encoder (paper: 2,000).", lower=1)

    def describe(self) -> str:
        if self.encoder == "grconv":
            return "RNNencdec with a grConv encoder (Cho et al. 2014b), no attention"
        return "RNNencdec (Cho et al. 2014a), no attention"

    def refuse(self, given: dict) -> None:
        if given.get("encoder_layers", 1) != 1:
            raise ConfigError("--encoder_layers goes with --model=rnnsearch; RNNencdec's encoder is one GRU "
                              "or a grConv.")
        if given.get("decoder", "bahdanau") != "bahdanau":
            raise ConfigError("--decoder goes with --model=rnnsearch; RNNencdec's decoder reads one fixed "
                              "summary c of the source and has no attention.")
        if given.get("decoder_transition_depth", 2) != 2:
            raise ConfigError("--decoder_transition_depth goes with --model=rnnsearch --decoder=cgru; "
                              "RNNencdec's decoder is one GRU.")


class Architecture(NamedTuple):
    module: str          # the model's module, imported when a model is built (it loads TensorFlow)
    model_class: str     # the Seq2SeqModel subclass in it
    config: type         # its ModelConfig


# --model name -> its model and configuration.
ARCHITECTURES = {
    "rnnsearch": Architecture("nmt_tf.models.rnnsearch", "RNNSearch", RNNSearchConfig),   # paper 000
    "rnnencdec": Architecture("nmt_tf.models.rnnencdec", "RNNEncDec", RNNEncDecConfig),   # papers 004, 002
}


# How the path of a Keras seed generator's state variable ends: the random
# state of a dropout layer, a variable of the model but not a weight.
RANDOM_STATE_SUFFIX = "/seed_generator_state"


def is_random_state(path: str) -> bool:
    """Whether the model variable at `path` is a dropout layer's random state
    (its path numbers the generators made before in the same process:
    seed_generator_16/... after other models)."""
    return path.endswith(RANDOM_STATE_SUFFIX)


def names_of(config_class) -> tuple[str, ...]:
    """The setting names of a configuration class."""
    return tuple(field.name for field in dataclasses.fields(config_class))


def architecture_of(model_config: ModelConfig) -> str:
    """The --model name of a model configuration."""
    for name, architecture in ARCHITECTURES.items():
        if type(model_config) is architecture.config:
            return name
    raise TypeError(f"{type(model_config).__name__} is not the configuration of a registered architecture")


def model_class(name: str):
    """The model class of --model=`name`; ValueError for an unknown name."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown --model={name}; choose one of {', '.join(ARCHITECTURES)}")
    architecture = ARCHITECTURES[name]
    return getattr(importlib.import_module(architecture.module), architecture.model_class)


def build_model(model_config: ModelConfig, source_vocab_size: int, target_vocab_size: int,
                transposed_products: bool = False):
    """The model of `model_config` (an architecture's configuration, e.g.
    `TrainingConfig.model_config()`), all weights created.
    `transposed_products`: training's time loops multiply by stored
    transposes of their step matrices (what
    nmt_tf.core.hardware.transposed_step_products() chooses for this
    machine; the numbers are the same to rounding)."""
    cls = model_class(architecture_of(model_config))
    model = cls.from_model_config(model_config, source_vocab_size, target_vocab_size, transposed_products)
    model.build()
    return model

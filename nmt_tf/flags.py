"""Command-line flags of the nmt_tf tools, each defined once.

Every CLI is ``python -m nmt_tf.<tool> [--flagfile=FILE] [--flag=value ...]``.
Flags are read left to right, so flags given after ``--flagfile`` override
the file's values. An unknown flag is an error (absl), and so is a flag of
another tool (`tool_flags` declares which of this module's flags a tool
takes; `start_cli` refuses the others, and the tool's --help lists them).

The training flags are the fields of `nmt_tf.config.TrainingConfig`, defined
here from it (same names, defaults, help and limits); `config_from_flags()`
gives the configuration the command line asks for. The library takes that
object and never reads flags: this module belongs to the command-line layer
(the tools and this module; tests/test_structure.py checks that no other
module imports it).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app, flags, logging

from nmt_tf import config
from nmt_tf.config import DecodingConfig, ExportConfig, SearchOptions, ServerConfig, TrainingConfig
from nmt_tf.core import precision, settings, startup

FLAGS = flags.FLAGS


def _help_exits_with_0(flag_class) -> None:
    """absl ends --help, --helpshort, --helpfull and --helpxml with exit code 1,
    as if help were an error; asked for, it is a success (0), as with argparse
    and GNU tools. Flag errors keep absl's 1."""
    parse = flag_class.parse

    def parse_then_succeed(self, arg):
        try:
            parse(self, arg)
        except SystemExit as e:
            raise SystemExit(0) from e

    flag_class.parse = parse_then_succeed


for _help_flag in (app.HelpFlag, app.HelpfullFlag, app.HelpXMLFlag):    # HelpshortFlag is a HelpFlag
    _help_exits_with_0(_help_flag)

# ---------------------------------------------------------------- training (data, model, training)
def _define(field, module_name: str | None = None) -> None:
    """The flag of a nmt_tf.config field (TrainingConfig, SearchOptions, ServerConfig): its name, default, help
    and limits; it belongs to `module_name` (a tool's __name__) or to this module."""
    meta = field.metadata
    default = settings.default(field)
    # absl's bounds are inclusive: a bound the value must exceed (`above`) is checked by the configuration.
    lower = meta["lower"] if meta["lower"] is not None else meta["above"]
    extra = {k: v for k, v in (("lower_bound", lower), ("upper_bound", meta["upper"])) if v is not None}
    if module_name is not None:      # as absl names the module that defines a flag itself
        extra["module_name"] = sys.argv[0] if module_name == "__main__" else module_name
    if meta["flag"] == "enum":
        flags.DEFINE_enum(settings.flag_name(field), default, list(meta["choices"]), meta["help"], **extra)
    else:
        getattr(flags, f"DEFINE_{meta['flag']}")(settings.flag_name(field), default, meta["help"], **extra)


def define_settings(config_class, names=None, module_name: str | None = None) -> None:
    """Defines the flags of `config_class`'s fields (all, or those in `names`),
    as flags of `module_name` (a tool defining its own: its __name__) or of this module."""
    for field in dataclasses.fields(config_class):
        if names is None or field.name in names:
            _define(field, module_name)


define_settings(TrainingConfig)

# The flags above make up a training job's configuration (nmt_tf.config, config.json).
TRAINING_FLAGS = tuple(sorted(config.NAMES))

# ---------------------------------------------------------------- search (export, translate, evaluate)
define_settings(SearchOptions)

define_settings(DecodingConfig, ("replace_unk", "unk_dictionary"))

SEARCH_FLAGS = tuple(sorted(set(f.name for f in FLAGS.get_flags_for_module(__name__)) - set(TRAINING_FLAGS)))

# ---------------------------------------------------------------- using a trained model (export, translate, evaluate, visualize, serve)
# --model_name and --preset: settings of nmt_tf.serve (ServerConfig) that other tools take too.
SHARED_SERVER_FLAGS = ("model_name", "preset", "runtime", "litert_weights", "litert_threads")
define_settings(ServerConfig, SHARED_SERVER_FLAGS)
flags.DEFINE_string("saved_model", None, "A SavedModel version directory written by nmt_tf.export (instead of --model_dir).")
flags.DEFINE_string("checkpoint", "best", "Weights to use from --model_dir: best (by the dev metric; falls back to last), last, averaged (written by nmt_tf.average), or a checkpoint path.")
flags.DEFINE_integer("average_checkpoints", 1, "Use the mean of the weights of this many checkpoints of --model_dir, taken from --average_from, instead of --checkpoint (1: no averaging).", lower_bound=1)
flags.DEFINE_multi_string("ensemble", None, "Further model directories decoded together with --model_dir as one ensemble: their log-probabilities are averaged at every search step (nmt_tf.export puts the ensemble into one SavedModel). Repeat the flag for each; the models must share their vocabularies.")
flags.DEFINE_enum("average_from", "best", ["best", "last"], "Checkpoints that --average_checkpoints averages: best (by dev score, best/; train with --keep_best_checkpoints) or last (checkpoints/; --keep_checkpoints).")
define_settings(DecodingConfig, ("max_input_length",))
flags.DEFINE_integer("lines_per_batch", 64, "Sentences translated (or pairs scored) together.", lower_bound=1)
flags.DEFINE_integer("sort_window", 1000, "nmt_tf.translate and nmt_tf.score: lines (pairs) read ahead and sent shortest first, in batches of --lines_per_batch, then written in input order: less padding and fewer steps per batch (at most --lines_per_batch: batches in input order, each written as soon as it is done).", lower_bound=1)
flags.DEFINE_integer("parallel_batches", 2, "nmt_tf.translate and nmt_tf.score: batches sent at once, as requests in flight with --server or signature calls on as many threads with --saved_model (two keep both cores of a small machine busy while one batch's search waits on its step's chain of small ops).", lower_bound=1)
flags.DEFINE_string("litert_model", None, "A LiteRT model folder written by nmt_tf.export --format=litert "
                    "(with --runtime=litert, instead of --preset).")
flags.DEFINE_string("server", None, "HOST:PORT of a TF Serving-compatible gRPC server (the official tensorflow_model_server or nmt_tf.serve), instead of --saved_model.")
flags.DEFINE_float("timeout", 120.0, "Seconds to wait for one request to --server.", lower_bound=0.1)
flags.DEFINE_string("input", None, "Input sentences, one per line (plain or gzip); default stdin.")
flags.DEFINE_string("output", None, "Output file; default stdout.")

# Which weights of a model directory a tool uses (nmt_tf.core.checkpoints.WeightsChoice).
WEIGHTS_FLAGS = ("checkpoint", "average_checkpoints", "average_from")
# Search settings that nmt_tf.export fixes in the SavedModel (--n_best may be lowered at run time).
FIXED_AT_EXPORT = tuple(name for name in SEARCH_FLAGS if name != "n_best") + ("max_input_length", "mixed_precision")

FROZEN_FLAGS = config.FROZEN


def tool_flags(module_name: str, names) -> frozenset:
    """Declares which flags of this module a tool (`module_name`, its
    __name__) uses, besides the flags it defines itself; returns them for
    `start_cli`. For the tool being run they become key flags of the main
    module, so that its --help lists them (absl's --help shows only the main
    module's key flags; --helpfull shows every flag of every module)."""
    names = frozenset(names)
    if module_name == "__main__":
        for name in sorted(names):
            FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
    return names


def foreign_flags(accepts: frozenset) -> list[str]:
    """Flags given on the command line (or in a flagfile) that belong to
    other nmt_tf tools: defined in an nmt_tf module other than the main one
    and not in `accepts`."""
    return sorted(flag.name for module, module_flags in FLAGS.flags_by_module_dict().items()
                  if module.startswith("nmt_tf.") and module != sys.argv[0]
                  for flag in module_flags if flag.present and flag.name not in accepts)


def fixed_at_export_given() -> list[str]:
    """The search and weights flags given, for a tool run on a SavedModel
    (where they were fixed by nmt_tf.export and would be ignored)."""
    return sorted(name for name in FIXED_AT_EXPORT + WEIGHTS_FLAGS if FLAGS[name].present)


def search_precision(log=print) -> str:
    """The Keras dtype policy nmt_tf.export / nmt_tf.evaluate build a model
    with: float32 unless --mixed_precision is given (auto: from this CPU,
    nmt_tf.core.precision, and `log` says what it chose)."""
    return precision.chosen(FLAGS.mixed_precision, log) if FLAGS["mixed_precision"].present else "float32"


FIXED_AT_EXPORT_REASON = "fixed when the SavedModel was exported: export again with it (nmt_tf.export)"


def start_cli(argv: list[str], verbose: bool = False, accepts: frozenset | None = None,
              reasons: dict[str, str] | None = None) -> None:
    """Common start of every nmt_tf CLI's main: no stray arguments, no flags
    of other tools (with `accepts`, from `tool_flags`; `reasons` says why a
    flag is refused, by name: one error line, exit code 1), quiet TF logs,
    and TensorFlow's first import without its start-up noise (nmt_tf.core.startup)."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if accepts is not None:
        foreign = foreign_flags(accepts)
        if foreign:
            tool = os.path.splitext(os.path.basename(sys.argv[0]))[0]
            reasons = reasons or {}
            why = "; ".join(f"--{name}: {reasons[name]}" for name in foreign if name in reasons)
            print(
                f"error: {', '.join('--' + n for n in foreign)}: not {'a flag' if len(foreign) == 1 else 'flags'} of "
                f"nmt_tf.{tool}, which would ignore {'it' if len(foreign) == 1 else 'them'}"
                f"{f' ({why})' if why else ''}. `python -m nmt_tf.{tool} --help` lists its flags.", file=sys.stderr)
            raise SystemExit(EXIT_USER_ERROR)
    # TensorFlow's Python INFO lines (checkpoint saver, ...) unless asked for.
    logging.set_verbosity(logging.INFO if verbose else logging.WARNING)
    startup.quiet_tensorflow_import()


EXIT_USER_ERROR = 1


def user_error(error, code: int = EXIT_USER_ERROR) -> int:
    """How every nmt_tf CLI reports a problem it can name (a missing file, a
    bad flag combination, bad input): one line `error: ...` on standard error,
    no traceback; returns the exit code for main to return (1 unless the tool
    documents another for this case)."""
    print(f"error: {error}", file=sys.stderr)
    return code


def nmt_flag_names() -> list[str]:
    """Names of the training flags (those stored in config.json)."""
    return list(TRAINING_FLAGS)



def weights_choice():
    """`nmt_tf.core.checkpoints.WeightsChoice` from --checkpoint, --average_checkpoints and --average_from."""
    from nmt_tf.core.checkpoints import WeightsChoice

    return WeightsChoice(FLAGS.checkpoint, FLAGS.average_checkpoints, FLAGS.average_from)


def _from_flags(config_class, **given):
    """A nmt_tf.config class made from the parsed flags of its setting fields
    and the `given` values (of its other fields, or instead of a flag's)."""
    return config_class(**{**{field.name: FLAGS[settings.flag_name(field)].value
                              for field in dataclasses.fields(config_class) if "flag" in field.metadata},
                           **given})


def search_options() -> SearchOptions:
    """`nmt_tf.config.SearchOptions` from the parsed search flags."""
    return _from_flags(SearchOptions)


def decoding_config(config_class=DecodingConfig, log=print, **given) -> DecodingConfig:
    """`nmt_tf.config.DecodingConfig` (or `ExportConfig`, as `config_class`)
    from the parsed flags: the search flags, the weights flags,
    --mixed_precision (float32 unless given; `log` says what auto chose),
    --max_input_length and [UNK] replacement (a ConfigError for a combination
    it cannot take); `given` values take the place of flags'."""
    return _from_flags(config_class, **{"search": search_options(), "weights": weights_choice(),
                                        "precision": search_precision(log), **given})


def export_config(**given) -> ExportConfig:
    """`nmt_tf.config.ExportConfig` from the parsed flags of nmt_tf.export
    (`decoding_config`'s, and how a search step's matrices are stored)."""
    return decoding_config(ExportConfig, **given)


def server_config() -> ServerConfig:
    """`nmt_tf.config.ServerConfig` from the parsed flags of nmt_tf.serve (a
    ConfigError for a value or combination it cannot take)."""
    return _from_flags(ServerConfig)


def config_from_flags() -> TrainingConfig:
    """The training configuration the parsed command line gives (nmt_tf.config)."""
    return TrainingConfig(**{name: FLAGS[name].value for name in config.NAMES})


def explicitly_set() -> set[str]:
    """Names of the training flags given on the command line or in a flagfile."""
    return {name for name in config.NAMES if FLAGS[name].present}

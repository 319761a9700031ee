"""The training configuration: typed, checked, saved with the run and read back."""

import dataclasses
import json

import pytest

from nmt_tf import config as nmt_config
from nmt_tf.config import (
    NAMES,
    ConfigError,
    DataConfig,
    DecodingConfig,
    ExportConfig,
    SearchOptions,
    TrainerConfig,
    TrainingConfig,
)
from nmt_tf.models import RNNEncDecConfig, RNNSearchConfig


def test_values_out_of_their_limits_are_one_error_naming_the_flag():
    with pytest.raises(ConfigError, match=r"--dropout=2.0: must be at least 0.0 and at most 0.95"):
        TrainingConfig(dropout=2.0)
    # A share or a factor that means nothing at 0 must be above it.
    with pytest.raises(ConfigError, match=r"--lr_decay_fraction=0.0: must be above 0.0 and at most 1.0"):
        TrainingConfig(lr_decay_fraction=0.0)
    with pytest.raises(ConfigError, match=r"--decay_factor=0.0: must be above 0.0 and at most 1.0"):
        TrainingConfig(decay_factor=0.0)
    assert TrainingConfig(lr_decay_fraction=1e-3, decay_factor=1.0).lr_decay_fraction == 1e-3
    with pytest.raises(ConfigError, match=r"--tokenizer='bytes': choose one of word, wordpiece, sentencepiece"):
        TrainingConfig(tokenizer="bytes")
    with pytest.raises(ConfigError, match="unknown setting"):
        TrainingConfig().replace(hidden_sizes=8)
    assert TrainingConfig().replace(batch_size=4).batch_size == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainingConfig().batch_size = 4


def test_a_saved_configuration_reads_back_and_reruns_as_a_flagfile(tmp_path):
    from nmt_tf import flags

    config = TrainingConfig(train_src="a.en", train_tgt="a.fr", hidden_size=12, freeze=["encoder"],
                            layer_norm=True, dry_run=True, distribution="mirrored")
    nmt_config.save(config, str(tmp_path))
    stored = json.load(open(tmp_path / "config.json"))
    assert set(stored) == {"format_version", "data", "model", "trainer"}
    assert stored["format_version"] == nmt_config.CONFIG_FORMAT
    assert stored["data"]["train_src"] == "a.en" and stored["trainer"]["freeze"] == ["encoder"]
    assert stored["model"] == {"model": "rnnsearch", **dataclasses.asdict(config.model_config())}
    assert stored["model"]["hidden_size"] == 12 and "grconv_size" not in stored["model"]   # RNNsearch's own only
    assert "dry_run" not in stored["trainer"] and "distribution" not in stored["trainer"]  # where it runs
    assert nmt_config.load(str(tmp_path)) == config.replace(dry_run=False, distribution="none")
    try:
        flags.FLAGS(["train", f"--flagfile={tmp_path / 'flags.txt'}"])
        assert flags.config_from_flags() == config.replace(dry_run=False, distribution="none")
    finally:
        flags.FLAGS.unparse_flags()
    empty = TrainingConfig(freeze=[])
    nmt_config.save(empty, str(tmp_path))
    assert "--freeze=\n" in (tmp_path / "flags.txt").read_text()


def test_a_config_json_of_a_newer_format_is_refused_with_the_fix_and_an_older_one_reads(tmp_path):
    config = TrainingConfig(hidden_size=12)
    nmt_config.save(config, str(tmp_path))
    path = tmp_path / "config.json"
    stored = json.load(open(path))
    del stored["format_version"]                     # as nmt_tf 0.1.0 wrote it (the shipped preset's)
    path.write_text(json.dumps(stored))
    assert nmt_config.load(str(tmp_path)) == config
    path.write_text(json.dumps({**stored, "format_version": nmt_config.CONFIG_FORMAT + 1}))
    with pytest.raises(nmt_config.ConfigError, match="written by a newer nmt_tf .* upgrade nmt_tf") as e:
        nmt_config.load(str(tmp_path))
    assert str(e.value).startswith(f"{path} has format_version 2") and "damaged" not in str(e.value)


def test_a_run_of_another_nmt_tf_version_still_loads(tmp_path):
    """Settings a newer version added keep their defaults; ones it dropped are
    ignored. A run from before config.json (a flat flags.json, where every
    architecture's sizes were stored) loads, and config.json wins once written."""
    stored = {name: value for name, value in TrainingConfig(hidden_size=12).as_dict().items()
              if name not in ("lr_schedule", "freeze")}
    stored["a_setting_no_longer_known"] = 3
    stored.update(model="rnnencdec", attention_size=16, encoder="grconv")     # attention_size: not RNNencdec's
    (tmp_path / "flags.json").write_text(json.dumps(stored))
    assert nmt_config.path(str(tmp_path)) == str(tmp_path / "flags.json")
    loaded = nmt_config.load(str(tmp_path))
    assert loaded.hidden_size == 12 and loaded.lr_schedule == "plateau" and loaded.freeze == []
    assert loaded.model_config().encoder == "grconv" and loaded.attention_size == 1000
    nmt_config.save(loaded.replace(hidden_size=14), str(tmp_path))
    assert nmt_config.path(str(tmp_path)) == str(tmp_path / "config.json")
    assert nmt_config.load(str(tmp_path)).hidden_size == 14
    with pytest.raises(FileNotFoundError, match="config.json not found: --model_dir must be a directory written"):
        nmt_config.load(str(tmp_path / "nothing"))


def test_the_parts_of_a_configuration():
    """The flat configuration (the command line's) and its typed parts: the
    data, the chosen architecture's model configuration, the trainer."""
    config = TrainingConfig(model="rnnencdec", encoder="grconv", grconv_size=40, attention_size=9, batch_size=7,
                            optimizer="adam")
    assert config.model_config() == RNNEncDecConfig(encoder="grconv", grconv_size=40)   # attention_size: ignored
    assert config.data().batch_size == 7 and config.trainer().optimizer == "adam"
    assert set(NAMES) == {f.name for part in (DataConfig, TrainerConfig, RNNSearchConfig, RNNEncDecConfig)
                          for f in dataclasses.fields(part)} | {"model"}
    assert TrainingConfig().model_config() == RNNSearchConfig()
    with pytest.raises(ConfigError, match="--encoder=grconv goes with --model=rnnencdec"):
        TrainingConfig(encoder="grconv")
    with pytest.raises(ConfigError, match="--encoder_layers goes with --model=rnnsearch"):
        TrainingConfig(model="rnnencdec", encoder_layers=2)
    assert TrainingConfig(encoder_layers=2).model_config() == RNNSearchConfig(encoder_layers=2)
    with pytest.raises(ConfigError, match="--decoder goes with --model=rnnsearch"):
        TrainingConfig(model="rnnencdec", decoder="cgru")
    assert TrainingConfig(decoder="cgru").model_config() == RNNSearchConfig(decoder="cgru")
    with pytest.raises(ConfigError, match="--decoder_transition_depth=3 needs --decoder=cgru"):
        TrainingConfig(decoder_transition_depth=3)
    with pytest.raises(ConfigError, match="--decoder_transition_depth goes with --model=rnnsearch --decoder=cgru"):
        TrainingConfig(model="rnnencdec", decoder_transition_depth=3)
    with pytest.raises(ConfigError, match="--decoder_transition_depth=1"):
        TrainingConfig(decoder="cgru", decoder_transition_depth=1)
    deep = TrainingConfig(decoder="cgru", decoder_transition_depth=3).model_config()
    assert deep == RNNSearchConfig(decoder="cgru", decoder_transition_depth=3)
    with pytest.raises(ConfigError, match="--rdrop_alpha=5.0 needs dropout"):
        TrainingConfig(rdrop_alpha=5.0)
    assert TrainingConfig(rdrop_alpha=5.0, recurrent_dropout=0.2).model_config().rdrop_alpha == 5.0
    with pytest.raises(ConfigError, match="--decoder='gru': choose one of bahdanau, cgru"):
        TrainingConfig(decoder="gru")
    with pytest.raises(ConfigError, match="--tied_embeddings=target needs --maxout_size equal to --embedding_size"):
        TrainingConfig(tied_embeddings="target")
    with pytest.raises(ConfigError, match=r"--hidden_size=0: must be at least 1"):
        RNNSearchConfig(hidden_size=0)


def test_search_options_check_their_limits_like_the_training_configuration():
    with pytest.raises(ConfigError, match=r"--beam_size=0: must be at least 1"):
        SearchOptions(beam_size=0)
    with pytest.raises(ConfigError, match=r"--max_output_length=0: must be at least 1"):
        SearchOptions(max_length=0)
    with pytest.raises(ConfigError, match=r"--length_penalty='wu': choose one of average, gnmt"):
        SearchOptions(length_penalty="wu")
    with pytest.raises(ConfigError, match=r"--n_best=3: must be at most --beam_size \(2\)"):
        SearchOptions(beam_size=2, n_best=3)
    with pytest.raises(ConfigError, match=r"--shortlist_size=5: must be 0 \(no shortlist\) or at least 16"):
        SearchOptions(shortlist_size=5)


def test_decoding_and_export_configurations_check_their_values_and_combinations():
    """What nmt_tf.evaluate decodes a model directory with, and what
    nmt_tf.export fixes in a SavedModel: the errors name the flags."""
    assert ExportConfig().search == SearchOptions() and ExportConfig().weights == "best"
    assert ExportConfig(SearchOptions(beam_size=3), max_input_length=20).search.beam_size == 3
    with pytest.raises(ConfigError, match=r"--max_input_length=0: must be at least 1"):
        DecodingConfig(max_input_length=0)
    with pytest.raises(ConfigError, match=r"--unk_dictionary goes with --replace_unk"):
        DecodingConfig(unk_dictionary="dictionary.tsv")
    with pytest.raises(ConfigError, match=r"precision 'bfloat16': choose one of float32, mixed_bfloat16, mixed_float16"):
        ExportConfig(precision="bfloat16")
    with pytest.raises(ConfigError, match=r"search: a SearchOptions, not dict"):
        DecodingConfig(search={"beam_size": 3})
    with pytest.raises(ConfigError, match=r"--freeze_token_products needs --freeze_step_weights"):
        ExportConfig(freeze_step_weights=False)
    assert not ExportConfig(freeze_step_weights=False, freeze_token_products=False).freeze_step_weights


def test_export_and_evaluation_take_their_configuration_and_say_so_otherwise(tmp_path):
    """A SearchOptions where an ExportConfig or DecodingConfig belongs (the
    arguments before the configurations existed) is one TypeError saying
    what to pass, before anything is read."""
    from nmt_tf.evaluation import quality as evaluation
    from nmt_tf.exporting import saved_model as exporter

    with pytest.raises(TypeError, match=r"config: an ExportConfig, not SearchOptions"):
        exporter.export(str(tmp_path / "no-model"), str(tmp_path / "e"), SearchOptions())
    with pytest.raises(TypeError, match=r"decoding: a DecodingConfig, not SearchOptions"):
        evaluation.run([("model_dir", str(tmp_path))], None, "a", "b", None, SearchOptions(), 4)


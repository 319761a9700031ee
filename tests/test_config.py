"""The training configuration: typed, checked, saved with the run and read back."""

import dataclasses
import json

import pytest

from nmt_tf import config as nmt_config
from nmt_tf.config import ConfigError, TrainingConfig


def test_values_out_of_their_limits_are_one_error_naming_the_flag():
    with pytest.raises(ConfigError, match=r"--dropout=2.0: must be at least 0.0 and at most 0.95"):
        TrainingConfig(dropout=2.0)
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
    stored = json.load(open(tmp_path / "flags.json"))
    assert "dry_run" not in stored and "distribution" not in stored     # where it runs, not what it trains
    assert nmt_config.load(str(tmp_path)) == config.replace(dry_run=False, distribution="none")
    try:
        flags.FLAGS(["train", f"--flagfile={tmp_path / 'flags.txt'}"])
        assert flags.config_from_flags() == config.replace(dry_run=False, distribution="none")
    finally:
        flags.FLAGS.unparse_flags()
    empty = TrainingConfig(freeze=[])
    nmt_config.save(empty, str(tmp_path))
    assert "--freeze=\n" in (tmp_path / "flags.txt").read_text()


def test_a_run_of_another_nmt_tf_version_still_loads(tmp_path):
    """Settings a newer version added keep their defaults; ones it dropped are ignored."""
    stored = {name: value for name, value in TrainingConfig(hidden_size=12).as_dict().items()
              if name not in ("lr_schedule", "freeze")}
    stored["a_setting_no_longer_known"] = 3
    (tmp_path / "flags.json").write_text(json.dumps(stored))
    loaded = nmt_config.load(str(tmp_path))
    assert loaded.hidden_size == 12 and loaded.lr_schedule == "plateau" and loaded.freeze == []
    with pytest.raises(FileNotFoundError, match="must be a directory written by nmt_tf.train"):
        nmt_config.load(str(tmp_path / "nothing"))

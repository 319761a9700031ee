"""Documentation and recipes stay true: every flag documented, every flagfile valid."""

import glob
import os
import re

import pytest

from conftest import REPO
from nmt_tf import flags


def readme():
    return open(os.path.join(REPO, "README.md"), encoding="utf-8").read()


def test_readme_quick_start_is_the_two_make_commands():
    quick = readme().split("## Quick start", 1)[1].split("##", 1)[0]
    commands = re.findall(r"^make \w+", quick, flags=re.M)
    assert commands == ["make train", "make test"]


def all_cli_flags():
    """Every flag defined by nmt_tf's modules (training, search, serving, each CLI)."""
    import nmt_tf.evaluate  # noqa: F401  (each CLI module defines its own flags)
    import nmt_tf.export  # noqa: F401
    import nmt_tf.score  # noqa: F401
    import nmt_tf.serve  # noqa: F401
    import nmt_tf.translate  # noqa: F401
    import nmt_tf.visualize  # noqa: F401

    modules = ("nmt_tf.flags", "nmt_tf.export", "nmt_tf.serve", "nmt_tf.translate", "nmt_tf.evaluate",
               "nmt_tf.visualize", "nmt_tf.score")
    return sorted({f.name for m in modules for f in flags.FLAGS.get_flags_for_module(m)})


@pytest.mark.parametrize("name", all_cli_flags())
def test_every_flag_is_in_the_readme(name):
    assert re.search(rf"--{name}(?![A-Za-z0-9_])", readme()), f"--{name} is not documented in README.md"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "pipelines", "**", "*.flags"),
                                              recursive=True))
                         + [os.path.join(REPO, "benchmarks", "reference.flags")])
def test_flagfiles_parse(path):
    try:
        flags.FLAGS(["train", f"--flagfile={path}"])
        assert flags.config_from_flags().tokenizer in ("word", "wordpiece", "sentencepiece")
    finally:
        flags.FLAGS.unparse_flags()


def test_the_readme_flag_table_shows_the_real_defaults():
    rows = re.findall(r"^\| `--(\w+)` \| `([^`]*)` \|", readme(), flags=re.M)
    assert len(rows) == len(flags.nmt_flag_names())
    for name, shown in rows:
        default = flags.FLAGS[name].default
        expected = "—" if default is None else (str(default).lower() if isinstance(default, bool) else str(default))
        assert shown == expected, (name, shown, expected)


@pytest.mark.parametrize("script,own_flag", [("train_throughput.py", "window_steps"),
                                             ("decode_speed.py", "sort_by_length"),
                                             ("serve_load.py", "clients_list")])
def test_benchmark_scripts_define_their_flags(script, own_flag):
    """A benchmark whose flags clash with nmt_tf's dies before measuring anything."""
    from conftest import run_cli

    done = run_cli(os.path.join(REPO, "benchmarks", script), "--helpshort", timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"--{own_flag}" in done.stdout + done.stderr

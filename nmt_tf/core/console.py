"""The console scripts of pyproject.toml: `nmt-tf-translate ...` is
`python -m nmt_tf.translate ...`.

Each script replaces its process with `python -m nmt_tf.<tool>` (the same
interpreter, the same arguments), so a tool runs exactly as documented: its
`--help` (absl shows the flags and docstring of the module run as
`__main__`), its exit codes and signals. The tools themselves are not
imported here.
"""

from __future__ import annotations

import os
import sys

TOOLS = ("train", "translate", "evaluate", "export", "serve", "score", "average", "shortlist", "unk_dictionary",
         "visualize", "presets")


def run_tool(tool: str) -> None:
    """Runs `python -m nmt_tf.<tool>` with this process's arguments, in its place."""
    if tool not in TOOLS:
        raise ValueError(f"no tool nmt_tf.{tool}; the tools are {', '.join(TOOLS)}")
    os.execv(sys.executable, [sys.executable, "-m", f"nmt_tf.{tool}", *sys.argv[1:]])


def train():
    run_tool("train")


def translate():
    run_tool("translate")


def evaluate():
    run_tool("evaluate")


def export():
    run_tool("export")


def serve():
    run_tool("serve")


def score():
    run_tool("score")


def average():
    run_tool("average")


def shortlist():
    run_tool("shortlist")


def unk_dictionary():
    run_tool("unk_dictionary")


def visualize():
    run_tool("visualize")


def presets():
    run_tool("presets")

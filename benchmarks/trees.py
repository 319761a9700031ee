"""What the side-by-side benchmarks share: a side's nmt_tf tree, from a directory or a git revision."""

from __future__ import annotations

import os
import subprocess

from absl import app

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args, cwd=REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def resolve_tree(spec: str, scratch: str, name: str) -> tuple[str, str | None]:
    """(directory, commit) of a side: a directory as it is, or a git revision
    extracted into `scratch` (its nmt_tf/ and benchmarks/)."""
    if os.path.isdir(spec):
        tree = os.path.abspath(spec)
        if not os.path.isfile(os.path.join(tree, "nmt_tf", "__init__.py")):
            raise app.UsageError(f"--{name}={spec}: no nmt_tf package in that directory")
        try:
            commit = git("rev-parse", "HEAD", cwd=tree)
            if git("status", "--porcelain", "--untracked-files=no", "--", "nmt_tf", "benchmarks", cwd=tree):
                commit += "+changes"
        except (subprocess.CalledProcessError, FileNotFoundError):
            commit = None
        return tree, commit
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except subprocess.CalledProcessError:
        raise app.UsageError(f"--{name}={spec}: neither a directory nor a git revision of {REPO}") from None
    tree = os.path.join(scratch, name)
    os.makedirs(tree)
    archive = subprocess.run(["git", "archive", commit, "nmt_tf", "benchmarks"], cwd=REPO, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree, commit

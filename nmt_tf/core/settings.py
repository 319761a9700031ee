"""A configuration field and the command-line flag it becomes, and the one check of its limits.

Every typed configuration of nmt_tf (nmt_tf.config's TrainingConfig and
SearchOptions, the architectures' model configs in nmt_tf.models) declares
its fields with `setting`: the type of flag, the default, the help text and
the limits. nmt_tf.flags defines each field's flag from that, and
`check_limits` enforces the choices and bounds for every configuration the
same way, with errors that name the flag. No absl and no TensorFlow here.
"""

from __future__ import annotations

import dataclasses


def setting(kind: str, default, help: str, choices=None, lower=None, upper=None, above=None, name=None):
    """A field of a configuration and the command-line flag it becomes:
    `kind` is absl's DEFINE_<kind> (string, integer, float, boolean, enum,
    list), `choices` an enum's values, `lower` / `upper` a number's bounds
    (inclusive), `above` a lower bound the value must exceed (a share or a
    factor that means nothing at 0), `name` the flag's name where it is not
    the field's."""
    metadata = {"flag": kind, "help": help, "choices": choices, "lower": lower, "upper": upper, "above": above,
                "name": name}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class ConfigError(ValueError):
    """A value a configuration cannot take, named as its flag."""


def flag_name(field) -> str:
    """The command-line flag of a configuration field."""
    return field.metadata["name"] or field.name


def default(field):
    """A field's default value."""
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def check_limits(config) -> None:
    """ConfigError for the first field of `config` (a dataclass of `setting`
    fields) outside its choices or bounds."""
    for field in dataclasses.fields(config):
        value, meta = getattr(config, field.name), field.metadata
        if "flag" not in meta:          # a field that is no setting (another configuration, an object)
            continue
        if meta["choices"] is not None and value not in meta["choices"]:
            raise ConfigError(f"--{flag_name(field)}={value!r}: choose one of {', '.join(meta['choices'])}")
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if (meta["lower"] is not None and value < meta["lower"]) or (
                meta["above"] is not None and value <= meta["above"]) or (
                meta["upper"] is not None and value > meta["upper"]):
            bounds = " and ".join(f"{word} {bound}" for word, bound in (
                ("at least", meta["lower"]), ("above", meta["above"]), ("at most", meta["upper"]))
                if bound is not None)
            raise ConfigError(f"--{flag_name(field)}={value}: must be {bounds}")

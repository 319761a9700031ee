"""Protobuf messages of TF Serving's config files that the tensorflow-serving-api
package does not ship (BatchingParameters, SSLConfig), declared here from
their .proto field numbers and types and read with protobuf's own text
parser, so that the files tensorflow_model_server takes are read the same
way, with its error messages (line and column)."""

from __future__ import annotations

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    wrappers_pb2,  # noqa: F401  (puts wrappers.proto into the default pool)
)

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"int64": _F.TYPE_INT64, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING}


def message_class(full_name: str, fields):
    """The message class `full_name` ("package.Message") with `fields`:
    (name, number, kind), kind a wrapper ("Int64Value", "StringValue", ...),
    a scalar ("int64", "bool", "string") or "repeated <scalar>"."""
    pool = descriptor_pool.Default()
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))
    except KeyError:
        pass
    package, _, name = full_name.rpartition(".")
    file = descriptor_pb2.FileDescriptorProto(name=f"nmt_tf/{name}.proto", package=package, syntax="proto3",
                                              dependency=["google/protobuf/wrappers.proto"])
    message = file.message_type.add(name=name)
    for field_name, number, kind in fields:
        field = message.field.add(name=field_name, number=number, label=_F.LABEL_OPTIONAL)
        if kind.endswith("Value"):
            field.type, field.type_name = _F.TYPE_MESSAGE, f".google.protobuf.{kind}"
        elif kind.startswith("repeated "):
            field.type, field.label = _SCALARS[kind.split()[1]], _F.LABEL_REPEATED
        else:
            field.type = _SCALARS[kind]
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def parse_text(cls, text: str, source: str, error=ValueError):
    """An instance of `cls` from its text format; a syntax error or an unknown
    field is `error(f"{source}: ...")` with protobuf's line and column."""
    proto = cls()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as e:
        raise error(f"{source}: {e}") from None
    return proto


def field_values(proto, fields) -> dict:
    """{name: value} of `fields` (as message_class takes them); a wrapper
    field that is not set is left out, so that the caller's default holds."""
    values = {}
    for name, _, kind in fields:
        if kind.endswith("Value"):
            if proto.HasField(name):
                values[name] = getattr(proto, name).value
        elif kind.startswith("repeated "):
            values[name] = tuple(getattr(proto, name))
        else:
            values[name] = getattr(proto, name)
    return values


def read_text_file(path: str, what: str, error=ValueError) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read the {what} {path}: {e}") from None

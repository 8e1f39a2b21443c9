"""Our job.proto is SINGA's: every message, field (name, number, label, type) and enum value of
SINGA's own job.proto and common.proto at v0.1.0, v0.2.0 and v0.3.0-rc3 (tests/config/singa_protos)
is in our compiled descriptors, unless an allow-list below says why not, one line per difference.

Additions on our side are fine.  SINGA's ``required`` may be our ``optional`` (the validator checks
presence and reports FILE:LINE); any other label or type change is a difference.  The SINGA files are
read by the small parser below (the subset they use), so the test needs no protoc; where grpcio-tools
is installed, the parser itself is checked against protoc.  An allow-list entry that no longer
matches a difference is an error too, so the lists shrink as the schema converges.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from singa_mpi.proto import job_pb2

PROTOS = pathlib.Path(__file__).parent / "singa_protos"
V01, V02, V03 = "v0.1.0", "v0.2.0", "v0.3.0-rc3"
TAGS = (V01, V02, V03)
ALL, V02_ON = TAGS, (V02, V03)
FILES = ("common.proto", "job.proto")  # singa.proto (zookeeper host, log dir) configures SINGA's daemons

# SINGA's messages and enums we do not carry at all: (tags where SINGA has it, name) -> why.
NOT_CARRIED = {
    (ALL, "MsgType"): "message types of SINGA's ZeroMQ router (server/stub runtime internals); MPI replaces it",
    (ALL, "EntityType"): "addresses of SINGA's router endpoints (runtime internals)",
    (ALL, "ConnectionType"): "SINGA's internal layer-connection kinds, never in a job file",
    (ALL, "CaffeDatum"): "Caffe's LMDB records, read only by kLMDBData, which is not ported (no LMDB reader)",
    (ALL, "CaffeBlob"): "Caffe's mean blobs for kLMDBData input, which is not ported (no LMDB reader)",
    (ALL, "MetricProto"): "metrics sent from SINGA's workers to its stub; ours are allreduced dicts",
    (ALL, "UniformProto"): "declared but used by no SINGA field",
    (ALL, "GaussianProto"): "declared but used by no SINGA field",
    ((V01,), "PartitionType"): "v0.1 leftover used by no field; partition_dim replaced it (SINGA-29)",
    ((V01,), "SingleLabelImageRecord"): "SINGA renamed it RecordProto in v0.2 (same fields); we carry that name",
    ((V01, V02), "PrefetchProto"): "kPrefetch runs sublayers in SINGA's prefetch thread; we do not carry it",
    (V02_ON, "ActivationType"): "nested as ActivationProto.ActivationType here: same values, same text format",
}

# Differences inside the messages and enums we do carry:
# (tags, "Message.field" | "Enum.VALUE" | "Enum" for all its values) -> why.
RENUMBERED_V02 = "SINGA-118 renumbered conf fields in v0.2; ours has v0.2/v0.3's number (wire only: job files are text)"
DIFFERENCES = {
    ((V01,), "LayerType"): "SINGA renumbered every LayerType value in v0.2 (SINGA-118); ours has v0.3's numbers",
    ((V01, V02), "LayerType.kPrefetch"): "kPrefetch is not carried (see PrefetchProto)",
    ((V01, V02), "LayerProto.prefetch_conf"): "kPrefetch is not carried (see PrefetchProto)",
    ((V01,), "Record.image"): "type SingleLabelImageRecord, renamed RecordProto by SINGA in v0.2 (same fields)",
    ((V02,), "StoreProto.batchsize"): "v0.2 optional, v0.3 repeated (SINGA-131); ours is v0.3's, one value parses",
    (ALL, "PoolingProto.pad"): "uint32 in SINGA, int32 here (as pad_x/y): every value SINGA accepts parses",
    (ALL, "PoolingProto.stride"): "uint32 in SINGA, int32 here (as stride_x/y): every value SINGA accepts parses",
    (V02_ON, "ActivationProto.type"): "its enum is nested as ActivationProto.ActivationType here (same values)",
    **{((V01,), f"LayerProto.{name}"): RENUMBERED_V02 for name in (
        "sharddata_conf", "lmdbdata_conf", "mnist_conf", "rgbimage_conf", "convolution_conf", "concate_conf",
        "dropout_conf", "innerproduct_conf", "lrn_conf", "pooling_conf", "rbm_conf", "relu_conf",
        "softmaxloss_conf", "slice_conf", "split_conf")},
}


# ------------------------------------------------------------------ the two sides as plain data

@dataclasses.dataclass(frozen=True)
class Field:
    number: int
    label: str  # optional | required | repeated
    type: str  # a scalar type name, or a message/enum name without the package ("PoolingProto.PoolMethod")


@dataclasses.dataclass
class Schema:
    messages: dict[str, dict[str, Field]]
    enums: dict[str, dict[str, int]]


SCALARS = {"double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
           "sfixed32", "sfixed64", "bool", "string", "bytes"}
TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|[A-Za-z_][\w.]*|[-+]?\d[\w.]*(?:[eE][-+]?\d+)?|\S',
                   re.DOTALL)


class ProtoParser:
    """The proto2 subset SINGA's files use: package, messages (nested), enums, fields
    ``LABEL TYPE NAME = N [options];``, extensions, reserved, options and comments.  Anything else
    (oneof, map, group, extend) is an error, so the parser never skips what it does not understand."""

    def __init__(self, text: str, where: str):
        self.where = where
        self.tokens = [t for t in TOKEN.findall(text) if not t.startswith(("//", "/*"))]
        self.pos = 0
        self.fields: dict[str, dict[str, tuple[int, str, str]]] = {}  # message -> name -> (number, label, raw type)
        self.enums: dict[str, dict[str, int]] = {}

    def error(self, expected: str) -> ValueError:
        got = self.tokens[self.pos] if self.pos < len(self.tokens) else "end of file"
        return ValueError(f"{self.where}: token {self.pos} {got!r}: expected {expected}")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise self.error(repr(expected) if expected else "a token")
        self.pos += 1
        return token

    def skip_statement(self) -> None:
        while self.take() != ";":
            pass

    def skip_options(self) -> None:
        """``[default = ..., packed = true]`` after a field or an enum value."""
        if self.peek() == "[":
            while self.take() != "]":
                pass

    def parse(self) -> ProtoParser:
        while self.peek() is not None:
            token = self.take()
            if token in ("syntax", "package", "import", "option"):
                self.skip_statement()
            elif token in ("message", "enum"):
                self.declaration(token, "")
            elif token != ";":
                self.pos -= 1
                raise self.error("syntax, package, import, option, message or enum")
        return self

    def declaration(self, kind: str, scope: str) -> None:
        name = f"{scope}.{self.take()}" if scope else self.take()
        self.take("{")
        if kind == "enum":
            self.enum_body(name)
        else:
            self.message_body(name)
        if self.peek() == ";":
            self.take()

    def message_body(self, name: str) -> None:
        fields = self.fields.setdefault(name, {})
        while (token := self.take()) != "}":
            if token in ("message", "enum"):
                self.declaration(token, name)
            elif token in ("extensions", "reserved", "option"):
                self.skip_statement()
            elif token in ("optional", "required", "repeated"):
                type_, field = self.take(), self.take()
                self.take("=")
                fields[field] = (int(self.take()), token, type_)
                self.skip_options()
                self.take(";")
            elif token != ";":
                self.pos -= 1
                raise self.error(f"a field, message, enum, extensions or '}}' in message {name}")

    def enum_body(self, name: str) -> None:
        values = self.enums.setdefault(name, {})
        while (token := self.take()) != "}":
            if token in ("option", "reserved"):
                self.skip_statement()
            elif token != ";":
                self.take("=")
                values[token] = int(self.take())
                self.skip_options()
                self.take(";")


def resolve(type_: str, scope: str, known: set[str], where: str) -> str:
    """Protobuf scoping: the innermost enclosing scope first; the package prefix is dropped."""
    if type_ in SCALARS:
        return type_
    type_ = type_.removeprefix(".").removeprefix("singa.")
    parts = scope.split(".")
    for depth in range(len(parts), -1, -1):
        candidate = ".".join(parts[:depth] + [type_])
        if candidate in known:
            return candidate
    raise ValueError(f"{where}: {scope}: type {type_}: not declared in {', '.join(FILES)}")


def singa_schema(tag: str) -> Schema:
    """SINGA's common.proto and job.proto at ``tag`` (one package, so one namespace)."""
    return schema_of([ProtoParser((PROTOS / tag / name).read_text(), f"{tag}/{name}").parse() for name in FILES],
                     tag)


def schema_of(parsers: list[ProtoParser], where: str) -> Schema:
    """Parsed files of one package as one Schema, every field's type resolved."""
    fields = {m: f for p in parsers for m, f in p.fields.items()}
    enums = {e: v for p in parsers for e, v in p.enums.items()}
    known = set(fields) | set(enums)
    messages = {m: {name: Field(number, label, resolve(type_, m, known, where))
                    for name, (number, label, type_) in f.items()} for m, f in fields.items()}
    return Schema(messages, enums)


_SCALAR_OF = {getattr(FieldDescriptor, name): name[len("TYPE_"):].lower()
              for name in dir(FieldDescriptor) if name.startswith("TYPE_")}


def _short(full_name: str) -> str:
    return full_name.removeprefix("singa.")


def descriptor_schema(file) -> Schema:
    """Our compiled descriptors (job_pb2.DESCRIPTOR) in the same shape."""
    messages, enums = {}, {}

    def enum(descriptor) -> None:
        enums[_short(descriptor.full_name)] = {v.name: v.number for v in descriptor.values}

    def message(descriptor) -> None:
        fields = {}
        for f in descriptor.fields:
            label = "repeated" if f.is_repeated else "required" if f.is_required else "optional"
            kind = f.message_type or f.enum_type
            fields[f.name] = Field(f.number, label, _short(kind.full_name) if kind else _SCALAR_OF[f.type])
        messages[_short(descriptor.full_name)] = fields
        for nested in descriptor.nested_types:
            message(nested)
        for nested in descriptor.enum_types:
            enum(nested)

    for descriptor in file.message_types_by_name.values():
        message(descriptor)
    for descriptor in file.enum_types_by_name.values():
        enum(descriptor)
    return Schema(messages, enums)


# ------------------------------------------------------------------ the comparison

def differences(theirs: Schema, ours: Schema) -> dict[str, str]:
    """Subject ("Message", "Message.field", "Enum.VALUE") -> what differs, for everything of SINGA's
    that ours lacks or has differently."""
    found = {}
    for name, fields in theirs.messages.items():
        if name not in ours.messages:
            found[name] = "message not in ours"
            continue
        for field, want in fields.items():
            got = ours.messages[name].get(field)
            if got is None:
                found[f"{name}.{field}"] = f"field not in ours (SINGA: {want.label} {want.type} = {want.number})"
                continue
            problems = []
            if got.number != want.number:
                problems.append(f"number {got.number}, SINGA {want.number}")
            if got.label != want.label and not (want.label == "required" and got.label == "optional"):
                problems.append(f"label {got.label}, SINGA {want.label}")
            if got.type != want.type:
                problems.append(f"type {got.type}, SINGA {want.type}")
            if problems:
                found[f"{name}.{field}"] = "; ".join(problems)
    for name, values in theirs.enums.items():
        if name not in ours.enums:
            found[name] = "enum not in ours"
            continue
        for value, number in values.items():
            got = ours.enums[name].get(value)
            if got is None:
                found[f"{name}.{value}"] = f"value not in ours (SINGA: {number})"
            elif got != number:
                found[f"{name}.{value}"] = f"number {got}, SINGA {number}"
    return found


OURS = descriptor_schema(job_pb2.DESCRIPTOR)


def allowance(tag: str, subject: str, theirs: Schema) -> str | None:
    """The reason an allow-list gives for ``subject`` at ``tag``, or None.  A SINGA message or enum
    we lack is looked up in NOT_CARRIED; anything else in DIFFERENCES, where an entry naming an enum
    covers its values."""
    whole = subject in theirs.messages or subject in theirs.enums
    for (tags, name), reason in (NOT_CARRIED if whole else DIFFERENCES).items():
        if tag in tags and (subject == name or (not whole and subject.startswith(name + "."))):
            return reason
    return None


@pytest.mark.parametrize("tag", TAGS)
def test_every_singa_message_field_and_enum_value_is_ours(tag):
    theirs = singa_schema(tag)
    assert len(theirs.messages) > 30 and len(theirs.enums) > 5  # the parser read the files
    unexplained = [f"{subject}: {what}" for subject, what in sorted(differences(theirs, OURS).items())
                   if allowance(tag, subject, theirs) is None]
    assert not unexplained, (f"SINGA {tag}: differences that no allow-list of tests/config/test_schema.py "
                             f"explains:\n" + "\n".join(unexplained))


def test_every_allowance_is_still_needed():
    found = {tag: differences(singa_schema(tag), OURS) for tag in TAGS}
    stale = []
    for whole, table in ((True, NOT_CARRIED), (False, DIFFERENCES)):
        for (tags, name), reason in table.items():
            for tag in tags:
                if not any(s == name or (not whole and s.startswith(name + ".")) for s in found[tag]):
                    stale.append(f"{tag} {name}: no longer differs: remove its allow-list entry ({reason})")
    assert not stale, "\n".join(stale)


def test_the_comparison_sees_each_kind_of_difference():
    """Parser and comparison on a small pair: a rename, a renumbering, an incompatible label, a type
    change, a lost enum value and a lost message are each seen; additions and required -> optional are not."""
    theirs = parse_schema("""
        package singa;  /* a block comment */
        message A { required string name = 1 [default = "x//y"]; optional int32 old = 2; repeated int32 r = 3;
                    optional uint32 u = 4; optional B.Kind kind = 5;
                    message B { enum Kind { kX = 0; kY = 1; }; } }
        message Gone { extensions 101 to 200; }
        enum E { kA = 1; kB = 2; };  // a trailing comment""")
    ours = parse_schema("""
        message A { optional string name = 1; optional int32 renamed = 2; optional int32 r = 3;
                    optional int32 u = 4; optional B.Kind kind = 5; optional int32 added = 300;
                    message B { enum Kind { kX = 0; kY = 2; kZ = 3; } } }
        enum E { kA = 1; }""")
    assert differences(theirs, ours) == {
        "A.old": "field not in ours (SINGA: optional int32 = 2)", "A.r": "label optional, SINGA repeated",
        "A.u": "type int32, SINGA uint32", "A.B.Kind.kY": "number 2, SINGA 1", "Gone": "message not in ours",
        "E.kB": "value not in ours (SINGA: 2)"}


def parse_schema(text: str) -> Schema:
    return schema_of([ProtoParser(text, "<test>").parse()], "<test>")


def test_the_parser_agrees_with_protoc(tmp_path):
    """Where grpcio-tools is installed, protoc reads SINGA's files to the same schema."""
    protoc = pytest.importorskip("grpc_tools.protoc", reason="needs grpcio-tools (pip install -e '.[test]')")
    for tag in TAGS:
        out = tmp_path / f"{tag}.desc"
        status = protoc.main(["protoc", f"-I{PROTOS / tag}", f"--descriptor_set_out={out}",
                              *(str(PROTOS / tag / name) for name in FILES)])
        assert status == 0, f"protoc rejected SINGA {tag}'s protos"
        compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
        assert _from_file_protos(compiled.file) == singa_schema(tag), tag


def _from_file_protos(files) -> Schema:
    labels = {1: "optional", 2: "required", 3: "repeated"}
    scalars = {number: name[len("TYPE_"):].lower() for name, number in descriptor_pb2.FieldDescriptorProto.Type.items()}
    messages, enums = {}, {}

    def walk(descriptors, enum_descriptors, scope: str) -> None:
        for e in enum_descriptors:
            enums[scope + e.name] = {v.name: v.number for v in e.value}
        for m in descriptors:
            messages[scope + m.name] = {
                f.name: Field(f.number, labels[f.label], _short(f.type_name.removeprefix(".")) if f.type_name
                              else scalars[f.type]) for f in m.field}
            walk(m.nested_type, m.enum_type, f"{scope}{m.name}.")

    for file in files:
        walk(file.message_type, file.enum_type, "")
    return Schema(messages, enums)

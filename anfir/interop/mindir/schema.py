"""The ``.mindir`` schema, built from the format's facts (field numbers and types).

A ``.mindir`` file is one serialized ``mind_ir.ModelProto`` (protobuf, proto2).
The message, field and enum numbers below are the interface MindSpore 2.10
reads and writes; anfir builds its own descriptor from them with
``google.protobuf.descriptor_pb2`` in a private descriptor pool (so it never
clashes with MindSpore's own classes when both are loaded in one process), and
needs nothing but ``protobuf`` (``pip install "anfir[mindir]"``).

Only what anfir reads or writes is declared; a field it does not know (a
parallel layout, a quantization parameter) is kept by protobuf as an unknown
field and ignored.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.errors import MissingDependencyError

EXTRA = "mindir"
"""The extra that installs what reading and writing ``.mindir`` needs."""

PACKAGE = "anfir_mindir"
"""The protobuf package of anfir's copy of the schema (not MindSpore's name, so
the two never meet in one descriptor pool)."""

# -- the facts ------------------------------------------------------------------------
ATTRIBUTE_TYPES = [
    "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
    "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16", "TENSOR",
    "GRAPH", "TENSORS", "TUPLE", "LIST", "DICT", "UMONAD", "IOMONAD", "NONE", "PRIMITIVECLOSURE",
    "FUNCGRAPHCLOSURE", "PARTIALCLOSURE", "UNIONFUNCCLOSURE", "CSR_TENSOR", "COO_TENSOR",
    "ROW_TENSOR", "CLASS_TYPE", "NAME_SPACE", "SYMBOL", "TYPE_NULL", "MAP_TENSOR", "FUNCTOR",
    "SCALAR", "SCALAR_GRAPH_HOLDER",
]
"""``AttributeProto.AttributeType``: value ``k`` is the k-th name."""

TENSOR_TYPES = [
    "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
    "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16", "FLOAT64",
    "QINT4X2",
]
"""``TensorProto.DataType``: value ``k`` is the k-th name."""

COMPRESSION_TYPES = ["NO_COMPRESSION", "INDEXING", "SPARSE", "FSE", "BIT_PACKING", "FSE_INT", "FSE_INFER"]

# (number, name, type, label, message type) per field; "?" optional, "*" repeated.
Field = tuple[int, str, str, str, str]
MESSAGES: dict[str, list[Field]] = {
    "AttributeProto.SeqInfoProto": [
        (1, "is_dyn_len", "bool", "?", ""), (2, "tuple_elem_item", "message", "?", "AttributeProto")],
    "AttributeProto": [
        (1, "name", "string", "?", ""), (2, "f", "float", "?", ""), (3, "i", "int64", "?", ""),
        (4, "d", "double", "?", ""), (5, "s", "bytes", "?", ""), (6, "t", "message", "?", "TensorProto"),
        (7, "g", "message", "?", "GraphProto"), (8, "floats", "float", "*", ""),
        (9, "doubles", "double", "*", ""), (10, "ints", "int64", "*", ""),
        (11, "strings", "bytes", "*", ""), (12, "tensors", "message", "*", "TensorProto"),
        (13, "graphs", "message", "*", "GraphProto"), (14, "doc_string", "string", "?", ""),
        (15, "ref_attr_name", "string", "?", ""), (16, "type", "enum", "?", "AttributeProto.AttributeType"),
        (17, "values", "message", "*", "AttributeProto"),
        (18, "seq_info", "message", "?", "AttributeProto.SeqInfoProto")],
    "ValueInfoProto": [
        (1, "name", "string", "?", ""), (2, "tensor", "message", "*", "TensorProto"),
        (3, "doc_string", "string", "?", ""), (4, "denotation", "string", "?", ""),
        (5, "attr_info", "message", "?", "AttributeProto")],
    "NodeProto": [
        (1, "input", "string", "*", ""), (2, "output", "string", "*", ""), (3, "name", "string", "?", ""),
        (4, "op_type", "string", "?", ""), (5, "attribute", "message", "*", "AttributeProto"),
        (6, "doc_string", "string", "?", ""), (7, "domain", "string", "?", ""),
        (8, "node_attr", "message", "*", "AttributeProto"),
        (9, "primal_attr", "message", "*", "AttributeProto")],
    "ModelProto": [
        (1, "ir_version", "string", "?", ""), (2, "producer_name", "string", "?", ""),
        (3, "producer_version", "string", "?", ""), (4, "domain", "string", "?", ""),
        (5, "model_version", "string", "?", ""), (6, "doc_string", "string", "?", ""),
        (7, "graph", "message", "?", "GraphProto"), (8, "functions", "message", "*", "GraphProto"),
        (10, "little_endian", "bool", "?", ""),
        (12, "primitives", "message", "*", "PrimitiveProto"), (13, "mind_ir_version", "int64", "?", ""),
        (14, "user_info", "message", "*", "ModelProto.UserInfoEntry")],
    "ModelProto.UserInfoEntry": [(1, "key", "string", "?", ""), (2, "value", "string", "?", "")],
    "GraphProto": [
        (1, "node", "message", "*", "NodeProto"), (2, "name", "string", "?", ""),
        (3, "parameter", "message", "*", "TensorProto"), (4, "doc_string", "string", "?", ""),
        (5, "input", "message", "*", "ValueInfoProto"), (6, "output", "message", "*", "ValueInfoProto"),
        (7, "bprop_hash", "string", "?", ""), (8, "attribute", "message", "*", "AttributeProto"),
        (9, "bprop_filepath", "string", "?", "")],
    "TensorProto.ExternalDataProto": [
        (1, "location", "string", "?", ""), (2, "offset", "int64", "?", ""), (3, "length", "int64", "?", "")],
    "TensorProto": [
        (1, "dims", "int64", "*", ""), (2, "data_type", "int32", "?", ""), (3, "float_data", "float", "*", ""),
        (4, "int32_data", "int32", "*", ""), (5, "string_data", "bytes", "*", ""),
        (6, "int64_data", "int64", "*", ""), (7, "name", "string", "?", ""),
        (8, "doc_string", "string", "?", ""), (9, "raw_data", "bytes", "?", ""),
        (10, "double_data", "double", "*", ""), (11, "uint64_data", "uint64", "*", ""),
        (12, "external_data", "message", "?", "TensorProto.ExternalDataProto"),
        (13, "ref_key", "string", "?", ""), (14, "min_dims", "int64", "*", ""),
        (15, "max_dims", "int64", "*", ""),
        (16, "compression_type", "enum", "?", "TensorProto.CompressionType")],
    "PrimitiveProto": [
        (1, "name", "string", "?", ""), (2, "op_type", "string", "?", ""),
        (3, "attribute", "message", "*", "AttributeProto"), (4, "instance_name", "string", "?", ""),
        (5, "prim_type", "enum", "?", "PrimitiveProto.PrimType")],
}
ENUMS: dict[str, list[tuple[str, int]]] = {
    "AttributeProto.AttributeType": [(n, k) for k, n in enumerate(ATTRIBUTE_TYPES)],
    "TensorProto.DataType": [(n, k) for k, n in enumerate(TENSOR_TYPES)],
    "TensorProto.CompressionType": [(n, k) for k, n in enumerate(COMPRESSION_TYPES)],
    "PrimitiveProto.PrimType": [("PRIMITIVE", 1), ("PRIMITIVE_FUNCTION", 2)],
}

_CLASSES: Optional[dict[str, Any]] = None


def require_protobuf() -> Any:
    """The ``google.protobuf`` package, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import google.protobuf as protobuf  # type: ignore[import-untyped]
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            f'reading and writing .mindir files needs protobuf: pip install "anfir[{EXTRA}]"') from None
    return protobuf


def classes() -> dict[str, Any]:
    """The message classes by name (``"ModelProto"``, ``"TensorProto"``...), built once."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build()
    return _CLASSES


def _build() -> dict[str, Any]:
    require_protobuf()
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    kinds = {"string": F.TYPE_STRING, "bytes": F.TYPE_BYTES, "bool": F.TYPE_BOOL,
             "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE, "int32": F.TYPE_INT32,
             "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64, "message": F.TYPE_MESSAGE,
             "enum": F.TYPE_ENUM}
    fdp = descriptor_pb2.FileDescriptorProto(name="anfir_mind_ir.proto", package=PACKAGE,
                                              syntax="proto2")
    made: dict[str, Any] = {}

    def message(path: str) -> Any:
        if path in made:
            return made[path]
        outer, _, inner = path.rpartition(".")
        parent = fdp.message_type if not outer else message(outer).nested_type
        made[path] = parent.add(name=inner)
        return made[path]

    for path in MESSAGES:  # outer messages first (the table lists nested ones by path)
        message(path)
    for path, values in ENUMS.items():
        outer, _, inner = path.rpartition(".")
        enum = message(outer).enum_type.add(name=inner)
        for name, number in values:
            enum.value.add(name=name, number=number)
    for path, fields in MESSAGES.items():
        msg = message(path)
        for number, name, kind, label, type_name in fields:
            field = msg.field.add(name=name, number=number, type=kinds[kind],
                                  label=F.LABEL_REPEATED if label == "*" else F.LABEL_OPTIONAL)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {path: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{path}"))
            for path in MESSAGES}

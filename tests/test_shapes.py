"""Shape and dtype rules on integer and symbolic dimensions (anfir.abstract.shapes/rules)."""

from __future__ import annotations

import pytest
import sympy

import numpy as np

import anfir
import anfir.primitives  # noqa: F401  (registers the primitives and their rules)
from anfir.abstract import rules
from anfir.abstract.lattice import BOTTOM, JoinError, join, widen
from anfir.abstract.shapes import (broadcast_shapes, dim_symbol, dims_equal, fresh_dim,
                                   is_unknown_dim, matmul_shape, reduce_shape, reshape_shape,
                                   transpose_shape)
from anfir.abstract.typeann import (abstract_from_annotation, abstract_from_annotation_text,
                                    match_annotation, parse_type_text)
from anfir.abstract.values import (AFunction, AScalar, AString, ATensor, ATuple, GraphSig,
                                   PrimFn)
from anfir.errors import AnfirSyntaxError, AnfirTypeError, ShapeError
from anfir.primitives import PRIMITIVES

B, N, K, H = (dim_symbol(n) for n in "BNKH")


def T(text: str) -> ATensor:
    value = abstract_from_annotation_text(text)
    assert isinstance(value, ATensor)
    return value


# -- broadcasting -----------------------------------------------------------------------
def test_broadcast_ints_and_ones() -> None:
    assert broadcast_shapes([(2, 3), (3,)]) == (2, 3)
    assert broadcast_shapes([(2, 1), (1, 4)]) == (2, 4)
    assert broadcast_shapes([(), (5,)]) == (5,)


def test_broadcast_symbols() -> None:
    assert broadcast_shapes([(B, 3), (3,)]) == (B, 3)
    assert broadcast_shapes([(B, 1), (1, K)]) == (B, K)
    assert broadcast_shapes([(B, K), (B, K)]) == (B, K)
    assert broadcast_shapes([(2 * B,), (B + B,)]) == (2 * B,)


def test_broadcast_mismatch_names_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"\[2, 3\] and \[4\]"):
        broadcast_shapes([(2, 3), (4,)])
    with pytest.raises(ShapeError, match="B does not match N"):
        broadcast_shapes([(B,), (N,)])
    with pytest.raises(ShapeError):
        broadcast_shapes([(B,), (3,)])


def test_unknown_dims_match_anything() -> None:
    u = fresh_dim()
    assert is_unknown_dim(u) and not is_unknown_dim(B)
    assert broadcast_shapes([(u, 3), (2, 3)]) == (2, 3)
    assert broadcast_shapes([(u,), (1,)]) == (u,)
    assert broadcast_shapes([None, (2,)]) is None


# -- matmul -------------------------------------------------------------------------------
def test_matmul_shapes() -> None:
    assert matmul_shape((B, 3), (3, K)) == (B, K)
    assert matmul_shape((2, 3), (3, 4)) == (2, 4)
    assert matmul_shape((3,), (3, K)) == (K,)
    assert matmul_shape((B, 3), (3,)) == (B,)
    assert matmul_shape((3,), (3,)) == ()
    assert matmul_shape((7, B, 3), (3, K)) == (7, B, K)
    assert matmul_shape((1, B, N), (5, N, K)) == (5, B, K)


def test_matmul_mismatch_message_shows_both_shapes() -> None:
    with pytest.raises(ShapeError) as info:
        matmul_shape((2, 3), (2, 3), "f64", "f64")
    assert "f64[2, 3] @ f64[2, 3]" in info.value.message
    with pytest.raises(ShapeError, match=r"f64\[B, N\] @ f64\[K, H\]"):
        matmul_shape((B, N), (K, H), "f64", "f64")
    with pytest.raises(ShapeError, match="rank >= 1"):
        matmul_shape((), (3,))


def test_matmul_rule_dtype_and_scalar_result() -> None:
    assert rules.matmul_rule(T("f32[B, 3]"), T("f32[3, K]")) == T("f32[B, K]")
    assert rules.matmul_rule(T("f32[3]"), T("f64[3]")) == AScalar("f64")
    with pytest.raises(AnfirTypeError, match="tensors"):
        rules.matmul_rule(AScalar("f64"), T("f64[3]"))


# -- reductions, transpose, reshape ---------------------------------------------------------
def test_reduce_shape() -> None:
    assert reduce_shape((B, 3, K), 1) == (B, K)
    assert reduce_shape((B, 3, K), -1) == (B, 3)
    assert reduce_shape((B, 3, K), (0, 2)) == (3,)
    assert reduce_shape((B, 3), None) == ()
    with pytest.raises(ShapeError, match="out of range"):
        reduce_shape((B, 3), 2)


def test_sum_rule() -> None:
    # A rule receives the call's attributes as keyword arguments (the engine
    # turns a positional axis, ``sum(x, 0)``, into ``axis=0`` first).
    total = PRIMITIVES["sum"].infer
    assert total(T("f64[B, K]")) == AScalar("f64")
    assert total(T("f64[B, K]"), axis=0) == T("f64[K]")
    assert total(T("f32[B, K]"), axis=-1) == T("f32[B]")
    assert total(T("f32[B, K]"), axis=-1, keepdims=True) == T("f32[B, 1]")
    assert total(T("f64[B]"), axis=0) == AScalar("f64")
    assert total(T("i32[3]")) == AScalar("i64")  # numpy sums small ints as int64
    assert PRIMITIVES["mean"].infer(T("i64[B, 2]"), axis=1) == T("f64[B]")
    with pytest.raises(AnfirTypeError, match="axis"):
        total(T("f64[B, K]"), axis="a")


def test_a_positional_axis_must_be_a_constant() -> None:
    program = anfir.parse("def f(x, a) = sum(x, a)")
    with pytest.raises(AnfirTypeError, match="constant"):
        anfir.compile(program, entry="f", args=[np.ones((2, 3)), 1])


def test_transpose() -> None:
    assert transpose_shape((B, 3, K)) == (K, 3, B)
    assert transpose_shape((B, 3, K), (1, 0, 2)) == (3, B, K)
    with pytest.raises(ShapeError, match="permutation"):
        transpose_shape((B, 3), (0, 0))
    assert rules.transpose_rule(T("f64[B, H]")) == T("f64[H, B]")
    perm = ATuple((AScalar("i64", 0), AScalar("i64", 2), AScalar("i64", 1)))
    assert rules.transpose_rule(T("f64[B, H, K]"), perm) == T("f64[B, K, H]")


def test_reshape() -> None:
    assert reshape_shape((B, 3), (3, B)) == (3, B)
    assert reshape_shape((B, 3), (-1,)) == (3 * B,)
    assert reshape_shape((B, 6), (B, 2, -1)) == (B, 2, 3)
    assert reshape_shape((2, 6), (-1, 4)) == (3, 4)
    with pytest.raises(ShapeError, match="elements"):
        reshape_shape((2, 3), (4, 2))
    with pytest.raises(ShapeError):
        reshape_shape((B, 3), (B, 2))
    with pytest.raises(ShapeError):
        reshape_shape((5,), (-1, 2))


def test_reshape_rule_with_unknown_and_symbolic_values() -> None:
    shape_b3 = ATuple((AScalar("i64", B), AScalar("i64", 3)))
    assert rules.reshape_rule(T("f64[3, B]"), shape_b3) == T("f64[B, 3]")
    unknown = rules.reshape_rule(T("f64[6]"), ATuple((AScalar("i64"), AScalar("i64", 2))))
    assert isinstance(unknown, ATensor) and is_unknown_dim(unknown.shape[0])
    assert unknown.shape[1] == 2


def test_shape_and_constructors_keep_symbols() -> None:
    shape = rules.shape_rule(T("f64[B, 3]"))
    assert shape == ATuple((AScalar("i64", B), AScalar("i64", 3)))
    assert PRIMITIVES["zeros"].infer(shape) == T("f64[B, 3]")
    assert PRIMITIVES["ones"].infer(shape, AString("f32")) == T("f32[B, 3]")
    assert rules.broadcast_to_rule(T("f64[3]"), shape) == T("f64[B, 3]")
    with pytest.raises(ShapeError):
        rules.broadcast_to_rule(T("f64[4]"), shape)


# -- elementwise dtypes follow numpy ----------------------------------------------------------
@pytest.mark.parametrize("name,args,expected", [
    ("add", (AScalar("i64"), AScalar("i64")), AScalar("i64")),
    ("add", (AScalar("bool"), AScalar("bool")), AScalar("i64")),
    ("div", (AScalar("i64"), AScalar("i64")), AScalar("f64")),
    ("mul", ("f32[B, 3]", AScalar("f64")), "f32[B, 3]"),
    ("mul", ("i64[B]", AScalar("f64")), "f64[B]"),
    ("add", ("f32[B, 1]", "f64[K]"), "f64[B, K]"),
    ("lt", ("f64[B]", AScalar("f64")), "bool[B]"),
    ("lt", (AScalar("i64"), AScalar("f64")), AScalar("bool")),
    ("tanh", ("f32[N]",), "f32[N]"),
    ("exp", (AScalar("i64"),), AScalar("f64")),
    ("add", ("f64[]", AScalar("f64")), AScalar("f64")),
])
def test_elementwise_dtypes(name: str, args: tuple, expected: object) -> None:
    conv = tuple(T(a) if isinstance(a, str) else a for a in args)
    want = T(expected) if isinstance(expected, str) else expected
    assert PRIMITIVES[name].infer(*conv) == want


def test_elementwise_rejects_non_numbers() -> None:
    with pytest.raises(AnfirTypeError, match="mul"):
        PRIMITIVES["mul"].infer(AScalar("i64"), ATuple(()))
    with pytest.raises(AnfirTypeError):
        PRIMITIVES["add"].infer(AString("a"), AScalar("i64"))


def test_tuple_and_switch_rules() -> None:
    t = ATuple((AScalar("i64"), AScalar("f64")))
    assert rules.tuple_getitem_rule(t, AScalar("i64", 1)) == AScalar("f64")
    assert rules.tuple_getitem_rule(t, AScalar("i64", -2)) == AScalar("i64")
    with pytest.raises(AnfirTypeError, match="out of range"):
        rules.tuple_getitem_rule(t, AScalar("i64", 2))
    with pytest.raises(AnfirTypeError, match="constant"):
        rules.tuple_getitem_rule(t, AScalar("i64"))
    assert rules.len_rule(t) == AScalar("i64", 2)
    f = AFunction(frozenset({PrimFn(PRIMITIVES["add"])}))
    g = AFunction(frozenset({PrimFn(PRIMITIVES["mul"])}))
    assert rules.switch_rule(AScalar("bool", True), f, g) == f
    assert rules.switch_rule(AScalar("bool"), f, g) == AFunction(f.options | g.options)
    with pytest.raises(AnfirTypeError, match="bool"):
        rules.switch_rule(AScalar("i64"), f, g)


def test_array_and_cast() -> None:
    nested = ATuple((ATuple((AScalar("f64", 1.0), AScalar("f64"))), ATuple((AScalar("i64"), AScalar("i64")))))
    assert rules.array_rule(nested) == T("f64[2, 2]")
    assert rules.cast_rule(T("f64[B]"), AString("f32")) == T("f32[B]")
    with pytest.raises(AnfirTypeError, match="dtype"):
        rules.cast_rule(T("f64[B]"), AString("f99"))


# -- lattice ------------------------------------------------------------------------------
def test_join_and_widen() -> None:
    assert join(BOTTOM, AScalar("i64", 1)) == AScalar("i64", 1)
    assert join(AScalar("i64", 1), AScalar("i64", 2)) == AScalar("i64")
    assert join(T("f64[B]"), T("f64[B]")) == T("f64[B]")
    with pytest.raises(JoinError):
        join(T("f64[2]"), T("f64[3]"))
    with pytest.raises(JoinError):
        join(AScalar("i64"), AScalar("f64"))
    with pytest.raises(JoinError):
        join(ATuple((AScalar("i64"),)), ATuple(()))
    assert widen(ATuple((AScalar("i64", 3), AString("f32")))) == ATuple((AScalar("i64"), AString("f32")))
    assert dims_equal(2 * B + 1, B + 1 + B)


# -- annotations -----------------------------------------------------------------------------
def test_annotation_text_and_binding() -> None:
    assert str(parse_type_text("f64[B, 3]")) == "f64[B, 3]"
    assert str(abstract_from_annotation_text("(f64[B, *], (i64, str), bool)")) == \
        "<Tuple(<f64[B, *]>, <Tuple(<Int64>, <String>)>, <Bool>)>"
    assert abstract_from_annotation_text("(f64,)") == ATuple((AScalar("f64"),))
    with pytest.raises(AnfirSyntaxError):
        parse_type_text("f64[B")
    binding: dict = {}
    a = abstract_from_annotation(parse_type_text("f64[D, H]"), binding)
    b = abstract_from_annotation(parse_type_text("f64[H, K]"), binding)
    assert isinstance(a, ATensor) and isinstance(b, ATensor) and a.shape[1] is b.shape[0]
    assert a.shape[0] == sympy.Symbol("D", integer=True, positive=True)


def test_match_annotation() -> None:
    ann = parse_type_text("f64[N, 3]")
    binding: dict = {}
    assert match_annotation(ann, T("f64[5, 3]"), binding) is None and binding["N"] == 5
    assert "dimension N" in match_annotation(parse_type_text("f64[N]"), T("f64[4]"), binding)
    assert match_annotation(parse_type_text("f64[*]"), T("f64[1, 2, 3]"), {}) is None
    assert match_annotation(parse_type_text("f64[N, *]"), T("f64[2, 7, 7]"), {}) is None
    assert match_annotation(parse_type_text("f64[N, *]"), T("f64[]"), {}) is not None
    assert match_annotation(parse_type_text("f64"), AScalar("i64"), {}) == "not f64"
    assert match_annotation(parse_type_text("f64"), T("f64[]"), {}) is None


def test_graph_signature_text() -> None:
    assert str(GraphSig((AScalar("f64"), AScalar("i64")), AScalar("f64"))) == \
        "(<Float64>, <Int64>) -> <Float64>"

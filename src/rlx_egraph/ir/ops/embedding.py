"""BERT's embeddings and their LayerNorm as one kernel (rules/embedding.egg)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..export import MS, OnnxWriter
from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OpSpec,
    ShapeError,
    Shapes,
    TensorType,
    op_spec,
    pick,
    positive,
    random_shape,
    register,
)
from ..shapes import broadcast
from . import reference as K
from .onnx_op import ONNX_DTYPES

if TYPE_CHECKING:
    from ..export import ExportBuilder
    from ..graph import Graph, Node

T = TensorType
F = AttrType.FLOAT
_EPS = AttrSpec("eps", F, 1e-5, check=positive)


def _embed_layer_norm_infer(a: Attrs, ins: list[T]) -> T:
    table, ids, first, gamma, beta, *second = ins
    x = op_spec("Embedding").infer({}, [table, ids])
    for label, t in zip(("first", "second"), (first, *second), strict=False):
        if t.dtype != x.dtype or broadcast(x.shape, t.shape) != x.shape:
            raise ShapeError(f"EmbedLayerNorm {label} {list(t.shape)} {t.dtype} must be {x.dtype} and broadcast to "
                             f"the embeddings {list(x.shape)}")
    return op_spec("LayerNorm").infer({"axis": -1}, [x, gamma, beta])


def _embed_layer_norm_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """LayerNorm(Add(Add(Embedding(table, ids), first), second)) over the last axis (without the second Add when
    there is no second term)."""
    table, ids, first, gamma, beta, *second = ins
    x = g.add(g.embedding(table, ids), first)
    for term in second:
        x = g.add(x, term)
    return g.layer_norm(x, gamma, beta, axis=-1, eps=a["eps"])


def _embed_layer_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """table [V, H], ids [S] or [B, S]; each addend of the embeddings' shape [..., S, H], or [S, H], [1, S, H]
    (2-D ids) or [H] broadcast over them, the second one or none; gamma and beta [H]."""
    vocab, width = random_shape(rng, 2, 2)
    ids = random_shape(rng, 1, 2)
    rows = (*ids, width)
    addends = [rows, rows[-2:], (width,), *([(1, *rows[-2:])] if len(ids) == 2 else [])]
    shapes = {"table": (vocab, width), "ids": ids, "first": pick(rng, addends), "gamma": (width,), "beta": (width,)}
    if rng.integers(2):
        shapes["second"] = pick(rng, addends)
    return shapes, {}


# --- ONNX exports (written against ExportBuilder, which the ONNX exporter's builder implements) ---


def _embed_layer_norm(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
    """com.microsoft EmbedLayerNormalization (f32, ids [B, S]) when first (+ second) is the same in every batch row,
    given per position: known terms of static shape (their sum is its position table [S, H], row s for token s), or
    at any sequence length a gather of a table's rows by Arange(0, S) plus constant rows (BERT's position and
    token-type terms with symbolic dims: the table's rows plus the constant row).  A term that gathers a table's
    rows by ids known only at run time (BERT's token_type_ids input) is its segment term; a second such term
    (RoBERTa's positions from a CumSum of the mask) its position table with position_ids.  Ids not int32 are cast
    (one launch each); its mask_index output is written and unread.  Out-of-range ids fail in it (Gather takes
    negative ones)."""
    table, ids, _, gamma, beta = ins[:5]
    if types[0].dtype != "f32" or types[1].rank != 2:
        return None
    added = [2, *range(5, len(ins))]  # first, and second when there is one (DistilBERT's embeddings have none)
    gathers = {k: g for k in added if (g := _run_time_gather(b, node, ins, k)) is not None}
    position_ids, (segment_ids, segment_table) = "", next(iter(gathers.values()), ("", ""))
    terms = [k for k in added if k not in list(gathers)[:1]]
    known = [b.known(ins[k]) for k in terms]
    if all(t is not None for t in known) and all(isinstance(d, int) for d in node.shape):
        total = np.broadcast_to(sum(known), node.shape)
        if not (total == total[:1]).all():
            return None
        positions = b.const(np.ascontiguousarray(total[0]), types[2].dtype)
    elif len(gathers) == 2:
        position_ids, positions = gathers[5]
    else:
        rows = _position_rows(b, node, [node.inputs[k] for k in terms])
        if rows is None:
            return None
        positions = b.const(np.ascontiguousarray(rows), types[2].dtype)
    if types[1].dtype != "i32":
        ids = b.op("Cast", [ids], to=ONNX_DTYPES["i32"])
    inputs = [ids, segment_ids, table, positions, segment_table, gamma, beta, "", position_ids]
    return b.multi("EmbedLayerNormalization", inputs if position_ids else inputs[:7], (0, 1), domain=MS,
                   epsilon=node.attrs["eps"])[0]


def _run_time_gather(b: ExportBuilder, node: Node, ins: list[str], k: int) -> tuple[str, str] | None:
    """Input ``k`` of EmbedLayerNorm ``node`` when it gathers the rows of a 2-D parameter by ids [B, S] known only at
    run time: the ids (cast to int32) and the table as written; else None."""
    graph = b.graph
    if graph is None:
        return None
    n = graph.node(node.inputs[k])
    if n.op != "Embedding" or graph.node(n.inputs[0]).op != "Param":
        return None
    ids = graph.node(n.inputs[1])
    written = b.producer(ins[k])
    if ids.op in ("Arange", "Scalar", "Constant") or ids.shape != node.shape[:-1] or written is None or \
            written[0] != "Gather":
        return None
    table, index = written[1]
    return (index if ids.dtype == "i32" else b.op("Cast", [index], to=ONNX_DTYPES["i32"])), table


def _position_rows(b: ExportBuilder, node: Node, terms: list[int]) -> np.ndarray | None:
    """The position table [P, H] of embedding terms of any sequence length: one term a gather of a weight's rows by
    positions 0, 1, ... (Embedding of Arange(0, S), reshaped or broadcast), the other (if any) the same row
    everywhere (an Embedding by one constant id, or a known value of one row); None for other terms."""
    graph = b.graph
    if graph is None:
        return None

    def through_views(nid: int) -> Node:
        n = graph.node(nid)
        while n.op in ("Reshape", "Expand"):
            n = graph.node(n.inputs[0])
        return n

    def weight(nid: int) -> np.ndarray | None:
        n = graph.node(nid)
        return graph.weights.get(n.name) if n.op == "Param" else n.attrs["value"] if n.op == "Constant" else None

    positional, constant = None, None
    for nid in terms:
        n = through_views(nid)
        if n.op == "Embedding" and (rows := weight(n.inputs[0])) is not None and rows.ndim == 2:
            index = through_views(n.inputs[1])
            if index.op == "Arange" and index.attrs["start"] == 0:
                positional = rows
            elif index.op == "Scalar":
                constant = rows[int(index.attrs["value"])]
            continue
        value = weight(n.id)
        if value is None or value.shape[-1] != node.shape[-1]:
            return None
        flat = value.reshape(-1, value.shape[-1])
        if not (flat == flat[:1]).all():
            return None
        constant = flat[0]
    if positional is None or (constant is None and len(terms) > 1):
        return None
    if constant is None:  # (one term: the positions alone)
        return positional
    return positional + constant if positional.shape[-1] == constant.shape[-1] else None


EMBEDDING = [
    OpSpec("EmbedLayerNorm", Kind.FUSED, ("table", "ids", "first", "gamma", "beta", "second?"),
           _embed_layer_norm_infer, K.embed_layer_norm, (_EPS,),
           doc="LayerNorm over the last axis of (table[ids] + first) + second: BERT's word embeddings plus its "
               "token-type and position terms (DistilBERT's: the positions only, no second term), then the "
               "embeddings' norm.",
           decompose=_embed_layer_norm_decompose, sampler=_embed_layer_norm_sample, index_inputs=("ids",),
           onnx=OnnxWriter("com.microsoft EmbedLayerNormalization", _embed_layer_norm)),
]
register(*EMBEDDING)

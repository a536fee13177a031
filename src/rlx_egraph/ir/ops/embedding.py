"""BERT's embeddings and their LayerNorm as one kernel (rules/embedding.egg)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

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

if TYPE_CHECKING:
    from ..graph import Graph

T = TensorType
F = AttrType.FLOAT
_EPS = AttrSpec("eps", F, 1e-5, check=positive)


def _embed_layer_norm_infer(a: Attrs, ins: list[T]) -> T:
    table, ids, first, second, gamma, beta = ins
    x = op_spec("Embedding").infer({}, [table, ids])
    for label, t in (("first", first), ("second", second)):
        if t.dtype != x.dtype or broadcast(x.shape, t.shape) != x.shape:
            raise ShapeError(f"EmbedLayerNorm {label} {list(t.shape)} {t.dtype} must be {x.dtype} and broadcast to "
                             f"the embeddings {list(x.shape)}")
    return op_spec("LayerNorm").infer({"axis": -1}, [x, gamma, beta])


def _embed_layer_norm_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """LayerNorm(Add(Add(Embedding(table, ids), first), second)) over the last axis."""
    table, ids, first, second, gamma, beta = ins
    return g.layer_norm(g.add(g.add(g.embedding(table, ids), first), second), gamma, beta, axis=-1, eps=a["eps"])


def _embed_layer_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """table [V, H], ids [S] or [B, S]; each addend of the embeddings' shape [..., S, H], or [S, H], [1, S, H]
    (2-D ids) or [H] broadcast over them; gamma and beta [H]."""
    vocab, width = random_shape(rng, 2, 2)
    ids = random_shape(rng, 1, 2)
    rows = (*ids, width)
    addends = [rows, rows[-2:], (width,), *([(1, *rows[-2:])] if len(ids) == 2 else [])]
    return {"table": (vocab, width), "ids": ids, "first": pick(rng, addends), "second": pick(rng, addends),
            "gamma": (width,), "beta": (width,)}, {}


EMBEDDING = [
    OpSpec("EmbedLayerNorm", Kind.FUSED, ("table", "ids", "first", "second", "gamma", "beta"),
           _embed_layer_norm_infer, K.embed_layer_norm, (_EPS,),
           doc="LayerNorm over the last axis of (table[ids] + first) + second: BERT's word embeddings plus its "
               "token-type and position terms, then the embeddings' norm.",
           decompose=_embed_layer_norm_decompose, sampler=_embed_layer_norm_sample, index_inputs=("ids",)),
]
register(*EMBEDDING)

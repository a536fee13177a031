"""The numpy reference interpreter: ``evaluate(graph)``."""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

from ..ir.dtypes import dtype as lookup_dtype
from ..ir.dtypes import to_storage
from ..ir.graph import Graph, GraphError, Node
from .reference import run_node


def _rng(seed: int, name: str) -> np.random.Generator:
    """A generator keyed by (seed, name), so one name gets the same values in every graph."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def random_value(graph: Graph, node: Node, seed: int = 0) -> np.ndarray:
    """Seeded random data for a leaf, shaped by how the graph uses it.

    Embedding ids and loss targets stay in range, attention key masks keep at
    least one key per row, BCE probabilities stay in (0, 1), matrices are
    fan-in scaled.  Only consumers that no rewrite removes shape the data, so
    a leaf gets the same values in a graph and in its optimized version.
    """
    rng = _rng(seed, f"{node.op}:{node.name}")
    shape, dt = node.shape, node.dtype
    high = None
    for user in graph.users(node.id):
        u = graph.node(user)
        slot = u.inputs.index(node.id)
        if u.op == "Embedding" and slot == 1:
            high = graph.node(u.inputs[0]).shape[0]
        elif u.op == "CrossEntropyLoss" and slot == 1:
            high = graph.node(u.inputs[0]).shape[-1]
        elif (u.op == "Attention" and slot == 3) or (u.op == "FusedAttentionBlock" and slot == 3) \
                or (u.op == "FusedTransformerLayer" and slot == 13):
            return to_storage(_key_mask(shape), dt)
        elif u.op == "BceLoss":
            return to_storage(rng.uniform(0.05, 0.95, shape), dt)
    if dt in ("i64", "i32"):
        return rng.integers(0, high or 8, size=shape).astype(lookup_dtype(dt).storage)
    if dt == "bool":
        return rng.random(shape) < 0.5
    scale = 1.0 / np.sqrt(shape[-2]) if node.op == "Param" and len(shape) >= 2 else 1.0
    return to_storage(rng.standard_normal(shape) * scale, dt)


def _key_mask(shape: tuple[int, ...]) -> np.ndarray:
    """[B, Sk] mask of ones where batch row b drops its last min(b, Sk-1) keys."""
    mask = np.ones(shape)
    for b in range(shape[0]):
        drop = min(b, shape[1] - 1)
        if drop:
            mask[b, shape[1] - drop:] = 0.0
    return mask


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray] | None = None,
             params: Mapping[str, np.ndarray] | None = None, seed: int = 0,
             return_all: bool = False) -> list[np.ndarray] | dict[int, np.ndarray]:
    """Run ``graph`` with numpy; returns its outputs (or every node's value by id).

    Parameters missing from ``params`` take their value from the graph's weight
    store; inputs missing from ``feeds`` and parameters in neither get
    seeded random values keyed by name, so two graphs with the same leaves see
    the same data.  Derived parameters (ConcatParams) are built from ``params``.
    Names the graph does not have are ignored on purpose: an optimized graph
    accepts the parameters of the graph it came from, even one it no longer reads.
    """
    feeds, params = dict(feeds or {}), dict(params or {})
    values: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        if node.op in ("Input", "Param"):
            given = feeds.get(node.name) if node.op == "Input" else params.get(node.name, graph.weights.get(node.name))
            value = random_value(graph, node, seed) if given is None else np.asarray(given)
            if value.shape != node.shape:
                raise GraphError(f"node {node.id} ({node.op} {node.name!r}): fed shape {list(value.shape)}, "
                                 f"expected {list(node.shape)}")
            values[node.id] = to_storage(value, node.dtype)
            continue
        values[node.id] = run_node(node.spec, node.attrs, [values[i] for i in node.inputs],
                                   [graph.node(i).dtype for i in node.inputs], node.type)
    if return_all:
        return values
    return [values[i] for i in graph.outputs]

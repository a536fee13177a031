"""The numpy reference interpreter: ``evaluate(graph)``."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping

import numpy as np

from ..ir.dtypes import dtype as lookup_dtype
from ..ir.dtypes import to_storage
from ..ir.graph import Graph, GraphError, Node
from .reference import run_node


def _rng(seed: int, name: str) -> np.random.Generator:
    """A generator keyed by (seed, name), so one name gets the same values in every graph."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# Structured input slots, by input name in the registry: a slot whose name ends
# in "mask" holds a [B, Sk] key mask; "ids"/"targets" index the given axis of another input.
INDEX_SLOTS: dict[str, tuple[str, int]] = {"ids": ("table", 0), "targets": ("logits", -1)}


def _slot_name(node: Node, slot: int) -> str:
    """The registry name of ``node``'s input ``slot`` (variadic slots share the last name)."""
    names = node.spec.input_names
    return names[min(slot, len(names) - 1)]


def random_value(graph: Graph, node: Node, seed: int = 0) -> np.ndarray:
    """Seeded random data for a leaf, shaped by how the graph uses it.

    Key masks drop some keys in every batch row and keep at least one;
    embedding ids and loss targets cover their range (every value once the
    leaf has that many elements); BCE probabilities stay in (0, 1); matrices
    are fan-in scaled.  Only consumers that no rewrite removes shape the data,
    so a leaf gets the same values in a graph and in its optimized version.
    """
    rng = _rng(seed, f"{node.op}:{node.name}")
    shape, dt = node.shape, node.dtype
    high = None
    for user in graph.users(node.id):
        u = graph.node(user)
        for slot in (k for k, i in enumerate(u.inputs) if i == node.id):
            name = _slot_name(u, slot)
            if name.endswith("mask"):
                return to_storage(_key_mask(rng, shape), dt)
            if name in INDEX_SLOTS:
                source, axis = INDEX_SLOTS[name]
                high = graph.node(u.inputs[u.spec.input_names.index(source)]).shape[axis]
            elif u.op == "BceLoss":
                return to_storage(rng.uniform(0.05, 0.95, shape), dt)
    if dt in ("i64", "i32"):
        return _covering_ints(rng, shape, high or 8).astype(lookup_dtype(dt).storage)
    if dt == "bool":
        return rng.random(shape) < 0.5
    scale = 1.0 / np.sqrt(shape[-2]) if node.op == "Param" and len(shape) >= 2 else 1.0
    return to_storage(rng.standard_normal(shape) * scale, dt)


def _key_mask(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """[B, Sk] mask of ones and zeros: every row keeps between 1 and Sk-1 random keys (all when Sk = 1)."""
    batch, keys = shape
    mask = np.ones(shape)
    for b in range(batch if keys > 1 else 0):
        dropped = rng.permutation(keys)[:rng.integers(1, keys)]
        mask[b, dropped] = 0.0
    return mask


def _covering_ints(rng: np.random.Generator, shape: tuple[int, ...], high: int) -> np.ndarray:
    """Integers in [0, high) in random order, each value once before any repeats."""
    size = int(np.prod(shape, dtype=np.int64))
    return rng.permutation(np.resize(rng.permutation(high), size)).reshape(shape)


def leaf_value(graph: Graph, node: Node, feeds: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray],
               seed: int) -> np.ndarray:
    """An Input's or Param's stored value: fed (``feeds`` for an Input; ``params``, else the graph's weight
    store, for a Param), else seeded random data (:func:`random_value`).  GraphError naming the leaf when a
    given value has another shape.  Every runner of a graph takes its leaves from here."""
    given = feeds.get(node.name) if node.op == "Input" else params.get(node.name, graph.weights.get(node.name))
    value = random_value(graph, node, seed) if given is None else np.asarray(given)
    if value.shape != node.shape:
        raise GraphError(f"node {node.id} ({node.op} {node.name!r}): fed shape {list(value.shape)}, "
                         f"expected {list(node.shape)}")
    return to_storage(value, node.dtype)


def run_graph_node(graph: Graph, node: Node, args: list[np.ndarray]) -> np.ndarray:
    """``node``'s stored value from its inputs' stored values (see :func:`.reference.run_node`)."""
    return run_node(node.spec, node.attrs, args, [graph.node(i).dtype for i in node.inputs], node.type)


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray] | None = None,
             params: Mapping[str, np.ndarray] | None = None, seed: int = 0,
             return_all: bool = False,
             visit: Callable[[Node, np.ndarray], np.ndarray] | None = None) -> list[np.ndarray] | dict[int, np.ndarray]:
    """Run ``graph`` with numpy; returns its outputs (or every node's value by id).

    Parameters missing from ``params`` take their value from the graph's weight
    store; inputs missing from ``feeds`` and parameters in neither get
    seeded random values keyed by name, so two graphs with the same leaves see
    the same data.  Derived parameters (ConcatParams) are built from ``params``.
    Names the graph does not have are ignored on purpose: an optimized graph
    accepts the parameters of the graph it came from, even one it no longer reads.
    ``visit(node, value)``, when given, sees each value as it is computed and
    returns the value the rest of the run uses (the parity check's hook).
    """
    feeds, params = dict(feeds or {}), dict(params or {})
    values: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        if node.op in ("Input", "Param"):
            value = leaf_value(graph, node, feeds, params, seed)
        else:
            value = run_graph_node(graph, node, [values[i] for i in node.inputs])
        values[node.id] = visit(node, value) if visit else value
    if return_all:
        return values
    return [values[i] for i in graph.outputs]

"""The numpy reference interpreter: ``evaluate(graph)``."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache

import numpy as np

from ..ir.dtypes import dtype as lookup_dtype
from ..ir.dtypes import to_storage
from ..ir.graph import Graph, GraphError, Node
from ..ir.ops.onnx_op import index_inputs
from ..ir.ops.reference import run_node


def _rng(seed: int, name: str) -> np.random.Generator:
    """A generator keyed by (seed, name), so one name gets the same values in every graph (``default_rng([seed,
    crc32(name)])``, its seed sequence made once per key)."""
    return np.random.Generator(np.random.PCG64(_seed_sequence(seed, name)))


@lru_cache(maxsize=4096)
def _seed_sequence(seed: int, name: str) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, zlib.crc32(name.encode())])


# Structured input slots, by input name in the registry: a slot whose name ends
# in "mask" holds a [B, Sk] key mask; "ids"/"targets" index the given axis of another input.
INDEX_SLOTS: dict[str, tuple[str, int]] = {"ids": ("table", 0), "targets": ("logits", -1)}
# A special run (``special=k``, round k >= 1): this share of the elements of each float leaf drawn at random
# (at least one) takes special values, the kinds in a fixed order per leaf continued from round to round, so that
# special_rounds() rounds put every kind in every leaf (a one-element leaf: in every other round).
SPECIAL_SHARE = 0.125


class IndexRangeError(GraphError):
    """A node read index values outside the extent they index (data given, or drawn at random)."""


def special_values(name: str) -> np.ndarray:
    """The IEEE values a rewrite must keep exact, in float dtype ``name``'s storage: -0.0, +0.0, +inf, -inf,
    NaN, the least positive and negative subnormals and the largest finite values of both signs."""
    if name == "bf16":
        bits = np.array([0x8000, 0, 0x7F80, 0xFF80, 0x7FC0, 1, 0x8001, 0x7F7F, 0xFF7F], np.uint32) << 16
        return bits.view(np.float32)
    info = np.finfo(lookup_dtype(name).storage)
    tiny = info.smallest_subnormal
    return np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, tiny, -tiny, info.max, -info.max], info.dtype)


def special_count(size: int) -> int:
    """How many elements of a float leaf of ``size`` elements one special round sets (one-element leaves: one,
    in every other round)."""
    return max(1, round(size * SPECIAL_SHARE)) if size > 1 else size


def special_rounds(sizes: Iterable[int]) -> int:
    """The special rounds that put every kind of :func:`special_values` in every float leaf of more than one
    element, for leaves of these ``sizes`` (one round when there are none)."""
    kinds = len(special_values("f32"))
    return max((-(-kinds // special_count(n)) for n in sizes if n > 1), default=1)


def _slot_name(node: Node, slot: int) -> str:
    """The registry name of ``node``'s input ``slot`` (variadic slots share the last name)."""
    names = node.spec.input_names
    return names[min(slot, len(names) - 1)]


def index_slots(graph: Graph, node: Node) -> list[tuple[int, int]]:
    """(input slot, extent) of every input of ``node`` that holds indices: into a registry op's table or logits
    (:data:`INDEX_SLOTS`), or into an input of an ONNX Gather kept as an OnnxOp."""
    if node.op == "OnnxOp":
        return [(k, graph.node(node.inputs[data]).shape[axis]) for k, data, axis in index_inputs(node.attrs)
                if data < len(node.inputs)]
    out = []
    for slot in range(len(node.inputs)):
        name = _slot_name(node, slot)
        if name in INDEX_SLOTS:
            source, axis = INDEX_SLOTS[name]
            out.append((slot, graph.node(node.inputs[node.spec.input_names.index(source)]).shape[axis]))
    return out


def _feeds_indices(graph: Graph, node: Node) -> bool:
    """Whether an integer or bool leaf's values reach an index slot through integer and bool values only (a
    position computed from an attention mask: ``CumSum(mask) * mask - 1`` into a Gather of positions)."""
    seen, todo = {node.id}, [node.id]
    while todo:
        value = todo.pop()
        for user in graph.users(value):
            u = graph.node(user)
            if any(u.inputs[k] == value for k, _ in index_slots(graph, u)):
                return True
            if user not in seen and not u.parts and u.dtype in ("i64", "i32", "bool"):
                seen.add(user)
                todo.append(user)
    return False


def random_value(graph: Graph, node: Node, seed: int = 0, special: int = 0) -> np.ndarray:
    """Seeded random data for a leaf, shaped by how the graph uses it.

    Key masks drop some keys in every batch row and keep at least one;
    embedding ids, loss targets and the indices of an ONNX Gather cover their
    range (every value once the leaf has that many elements); an integer or
    bool leaf whose values reach such indices through integer arithmetic is a
    0/1 mask (a mask that positions are counted from); BCE probabilities stay
    in (0, 1); variances are positive; matrices are fan-in scaled.  Only consumers that no rewrite
    removes shape the data, so a leaf gets the same values in a graph and in
    its optimized version.  ``special``: a special round (k >= 1, see
    :func:`special_rounds`): a float leaf drawn this way also takes
    :func:`special_values` at SPECIAL_SHARE of its elements.
    """
    rng = _rng(seed, f"{node.op}:{node.name}")
    shape, dt = node.shape, node.dtype
    high = None
    for user in graph.users(node.id):
        u = graph.node(user)
        for slot in (k for k, i in enumerate(u.inputs) if i == node.id):
            if _slot_name(u, slot).endswith("mask") and u.op != "OnnxOp":
                return to_storage(_key_mask(rng, shape), dt)
            if u.op == "BceLoss":
                return to_storage(rng.uniform(0.05, 0.95, shape), dt)
            if _slot_name(u, slot) == "var":  # a BatchNorm's variance (and the derived weights that fold it)
                return to_storage(rng.uniform(0.25, 2.0, shape), dt)
        high = next((extent for k, extent in index_slots(graph, u) if u.inputs[k] == node.id), high)
    if dt in ("i64", "i32", "bool") and high is None and _feeds_indices(graph, node):
        return to_storage(_mask01(rng, shape), dt)
    if dt in ("i64", "i32"):
        return _covering_ints(rng, shape, high or 8).astype(lookup_dtype(dt).storage)
    if dt == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    scale = 1.0 / np.sqrt(shape[-2]) if node.op == "Param" and len(shape) >= 2 else 1.0
    value = to_storage(rng.standard_normal(shape) * scale, dt)
    return _with_specials(seed, f"{node.op}:{node.name}", value, dt, special) if special else value


def _with_specials(seed: int, name: str, value: np.ndarray, dt: str, special: int) -> np.ndarray:
    """``value`` with :func:`special_count` of its elements set to special values of ``dt`` in round
    ``special``: the kinds in an order fixed per leaf, round k taking the next ones after round k - 1's (a
    one-element value: one kind in every other round), at positions drawn per round."""
    size, specials = value.size, special_values(dt)
    order = _special_order(seed, name, len(specials))
    count = special_count(size)
    if size == 1:
        if special % 2 == 0:
            return value
        start = (special - 1) // 2
    else:
        start = (special - 1) * count
    out = value.copy().reshape(-1)
    out[_rng(seed, f"special {special}:{name}").choice(size, count, replace=False)] = \
        specials[order[(start + np.arange(count)) % len(specials)]]
    return out.reshape(value.shape)


@lru_cache(maxsize=4096)
def _special_order(seed: int, name: str, kinds: int) -> np.ndarray:
    """The order leaf ``name`` takes the ``kinds`` special values in on seed ``seed`` (the same in every round;
    read-only)."""
    order = _rng(seed, f"special:{name}").permutation(kinds)
    order.setflags(write=False)
    return order


def _key_mask(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """[B, Sk] mask of ones and zeros: every row keeps between 1 and Sk-1 random keys (all when Sk = 1)."""
    batch, keys = shape
    mask = np.ones(shape)
    for b in range(batch if keys > 1 else 0):
        dropped = rng.permutation(keys)[:rng.integers(1, keys)]
        mask[b, dropped] = 0.0
    return mask


def _mask01(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A 0/1 mask of any shape, each row along the last axis a :func:`_key_mask` row (1 for a scalar)."""
    if not shape:
        return np.ones(())
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return _key_mask(rng, (rows, shape[-1])).reshape(shape)


def _covering_ints(rng: np.random.Generator, shape: tuple[int, ...], high: int) -> np.ndarray:
    """Integers in [0, high) in random order, each value once before any repeats."""
    size = int(np.prod(shape, dtype=np.int64))
    return rng.permutation(np.resize(rng.permutation(high), size)).reshape(shape)


def leaf_value(graph: Graph, node: Node, feeds: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray],
               seed: int, special: int = 0) -> np.ndarray:
    """An Input's or Param's stored value: fed (``feeds`` for an Input; ``params``, else the graph's weight
    store, for a Param), else seeded random data (:func:`random_value`, with ``special``).  GraphError naming
    the leaf when a given value has another shape, or is not a real array of bool, int or float values.  Every
    runner of a graph takes its leaves from here."""
    given = feeds.get(node.name) if node.op == "Input" else params.get(node.name, graph.weights.get(node.name))
    if given is None:  # drawn as stored already
        return random_value(graph, node, seed, special)
    value = np.asarray(given)
    if value.dtype.kind not in "biuf":
        raise GraphError(f"node {node.id} ({node.op} {node.name!r}): given {value.dtype} values, expected a real "
                         f"array for {node.dtype} (bool, int or float)")
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
             visit: Callable[[Node, np.ndarray], np.ndarray] | None = None,
             special: int = 0) -> list[np.ndarray] | dict[int, np.ndarray]:
    """Run ``graph`` with numpy; returns its outputs (or every node's value by id).

    Parameters missing from ``params`` take their value from the graph's weight
    store; inputs missing from ``feeds`` and parameters in neither get
    seeded random values keyed by name, so two graphs with the same leaves see
    the same data.  Derived parameters (ConcatParams) are built from ``params``.
    Names the graph does not have are ignored on purpose: an optimized graph
    accepts the parameters of the graph it came from, even one it no longer reads.
    ``visit(node, value)``, when given, sees each value as it is computed and
    returns the value the rest of the run uses (the parity check's hook).
    ``special``: a special round (k >= 1): the leaves drawn at random also hold IEEE special values
    (:func:`random_value`).
    A node reading indices out of range raises :class:`IndexRangeError` naming it.
    """
    feeds, params = dict(feeds or {}), dict(params or {})
    values: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        if node.op in ("Input", "Param"):
            value = leaf_value(graph, node, feeds, params, seed, special)
        else:
            try:
                value = run_graph_node(graph, node, [values[i] for i in node.inputs])
            except IndexError as exc:
                raise IndexRangeError(f"node {node.id} ({node.op}): index values out of range: {exc}") from None
        values[node.id] = visit(node, value) if visit else value
    if return_all:
        return values
    return [values[i] for i in graph.outputs]

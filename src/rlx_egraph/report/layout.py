"""A layered drawing of a DAG, as coordinates: how the HTML report draws graphs without Graphviz.

The classic layered (Sugiyama) method, kept small:

1. Ranks: a node sits one rank below its lowest input (the longest path from a source); a node computed from
   sources alone (an Input, a Param, a concatenation of weights) sits just above its first consumer, not on
   the top rank.
2. An edge spanning several ranks passes through one virtual point per rank between its ends, so that
   edges are routed between boxes, not through them.
3. Order within a rank: barycenter sweeps (a rank sorted by the mean position of its neighbours in the rank
   above, then below), :data:`SWEEPS` times; the order with the fewest edge crossings is kept.
4. x: each rank is placed as close as its order and the gaps allow to the mean x of its neighbours
   (an isotonic regression, solved exactly by pooling adjacent violators), alternately from above and from
   below, :data:`PLACEMENTS` times.

Deterministic: the same graph gives the same coordinates.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SWEEPS = 12
PLACEMENTS = 8
VIRTUAL_WIDTH = 6.0


@dataclass(frozen=True)
class Layout:
    """Node centres, edge routes and the drawing's size (y grows downwards).

    ``edges[(source, target)]``: the points of the edge from the bottom of ``source`` to the top of ``target``.
    """

    positions: dict[int, tuple[float, float]]
    edges: dict[tuple[int, int], list[tuple[float, float]]]
    width: float
    height: float
    ranks: dict[int, int]


def layered_layout(nodes: Sequence[int], inputs: Mapping[int, Sequence[int]],
                   sizes: Mapping[int, tuple[float, float]], h_gap: float = 18.0, v_gap: float = 40.0,
                   margin: float = 10.0) -> Layout:
    """Lay out the DAG of ``nodes`` (in topological order) whose node ``n`` reads ``inputs[n]``; ``sizes[n]`` is
    its box's (width, height)."""
    edges = list(dict.fromkeys((i, n) for n in nodes for i in inputs.get(n, ())))
    rank = _ranks(nodes, edges)
    layers, chains, width = _layers(nodes, edges, rank, sizes)
    up, down = _neighbours(chains)
    layers = _order(layers, up, down)
    xs = _place(layers, up, down, width, h_gap)
    heights = [max((sizes[n][1] for n in layer if n >= 0), default=0.0) for layer in layers]
    tops = [margin + sum(heights[:r]) + v_gap * r for r in range(len(layers))]
    left = min((xs[n] - width[n] / 2 for layer in layers for n in layer), default=0.0)
    shift = margin - left
    centre = {n: (xs[n] + shift, tops[r] + heights[r] / 2) for r, layer in enumerate(layers) for n in layer}
    routes = {}
    for (source, target), chain in chains.items():
        (sx, sy), (tx, ty) = centre[source], centre[target]
        routes[(source, target)] = [(sx, sy + sizes[source][1] / 2), *(centre[v] for v in chain[1:-1]),
                                    (tx, ty - sizes[target][1] / 2)]
    right = max((centre[n][0] + width[n] / 2 for layer in layers for n in layer), default=0.0)
    return Layout({n: centre[n] for n in nodes}, routes, right + margin,
                  (tops[-1] + heights[-1] + margin) if layers else 2 * margin, {n: rank[n] for n in nodes})


def _ranks(nodes: Sequence[int], edges: list[tuple[int, int]]) -> dict[int, int]:
    readers: dict[int, list[int]] = {n: [] for n in nodes}
    sources: dict[int, list[int]] = {n: [] for n in nodes}
    for i, n in edges:
        readers[i].append(n)
        sources[n].append(i)
    rank: dict[int, int] = {}
    for n in nodes:
        rank[n] = 1 + max((rank[i] for i in sources[n]), default=-1)
    constant: set[int] = set()  # computed from sources alone (a weight, a concatenation of weights)
    for n in nodes:
        if all(i in constant for i in sources[n]):
            constant.add(n)
    for n in reversed(nodes):  # such a node just above its first reader
        if n in constant and readers[n]:
            rank[n] = min(rank[r] for r in readers[n]) - 1
    return rank


def _layers(nodes: Sequence[int], edges: list[tuple[int, int]], rank: dict[int, int],
            sizes: Mapping[int, tuple[float, float]]) -> tuple[list[list[int]], dict[tuple[int, int], list[int]],
                                                               dict[int, float]]:
    """The ranks' items (node ids, and virtual points as negative ids), each edge's chain of items, and each item's
    width."""
    layers: list[list[int]] = [[] for _ in range(max(rank.values(), default=-1) + 1)]
    width = {n: sizes[n][0] for n in nodes}
    for n in nodes:
        layers[rank[n]].append(n)
    chains: dict[tuple[int, int], list[int]] = {}
    virtual = 0
    for source, target in edges:
        chain = [source]
        for r in range(rank[source] + 1, rank[target]):
            virtual -= 1
            layers[r].append(virtual)
            width[virtual] = VIRTUAL_WIDTH
            chain.append(virtual)
        chains[(source, target)] = [*chain, target]
    return layers, chains, width


def _neighbours(chains: dict[tuple[int, int], list[int]]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Each item's neighbours in the rank above (``up``) and below (``down``)."""
    up: dict[int, list[int]] = {}
    down: dict[int, list[int]] = {}
    for chain in chains.values():
        for a, b in itertools.pairwise(chain):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
    return up, down


def _order(layers: list[list[int]], up: dict[int, list[int]], down: dict[int, list[int]]) -> list[list[int]]:
    """Barycenter sweeps; the order with the fewest crossings."""
    layers = [list(layer) for layer in layers]
    best, best_crossings = [list(layer) for layer in layers], _crossings(layers, down)
    for sweep in range(SWEEPS):
        ranks = range(1, len(layers)) if sweep % 2 == 0 else range(len(layers) - 2, -1, -1)
        other = up if sweep % 2 == 0 else down
        for r in ranks:
            near = layers[r - 1] if sweep % 2 == 0 else layers[r + 1]
            index = {n: k for k, n in enumerate(near)}
            current = {n: k for k, n in enumerate(layers[r])}

            def key(n: int, index: dict[int, int] = index, current: dict[int, int] = current,
                    other: dict[int, list[int]] = other) -> tuple[float, int]:
                seen = [index[m] for m in other.get(n, ())]
                return (sum(seen) / len(seen) if seen else current[n] * len(index) / max(len(current), 1),
                        current[n])

            layers[r].sort(key=key)
        crossings = _crossings(layers, down)
        if crossings < best_crossings:
            best, best_crossings = [list(layer) for layer in layers], crossings
    return best


def _crossings(layers: list[list[int]], down: dict[int, list[int]]) -> int:
    """Edge crossings between adjacent ranks (inversions, counted with a Fenwick tree)."""
    total = 0
    for r in range(len(layers) - 1):
        below = {n: k for k, n in enumerate(layers[r + 1])}
        ends = [below[m] for n in layers[r] for m in sorted(down.get(n, ()), key=below.__getitem__)]
        tree = [0] * (len(below) + 1)
        for seen, end in enumerate(ends):
            k, greater = end + 1, 0
            while k > 0:  # how many of the ends so far are <= end
                greater += tree[k]
                k -= k & -k
            total += seen - greater
            k = end + 1
            while k <= len(below):
                tree[k] += 1
                k += k & -k
    return total


def _place(layers: list[list[int]], up: dict[int, list[int]], down: dict[int, list[int]], width: dict[int, float],
           gap: float) -> dict[int, float]:
    """x of every item: packed first, then pulled towards its neighbours' mean, rank by rank."""
    x: dict[int, float] = {}
    for layer in layers:
        edge = 0.0
        for n in layer:
            x[n] = edge + width[n] / 2
            edge += width[n] + gap
    for placement in range(PLACEMENTS):
        ranks = range(1, len(layers)) if placement % 2 == 0 else range(len(layers) - 2, -1, -1)
        other = up if placement % 2 == 0 else down
        for r in ranks:
            layer = layers[r]
            wanted = [sum(x[m] for m in other[n]) / len(other[n]) if other.get(n) else x[n] for n in layer]
            for n, value in zip(layer, _spaced(wanted, [width[n] for n in layer], gap), strict=True):
                x[n] = value
    return x


def _spaced(wanted: list[float], widths: list[float], gap: float) -> list[float]:
    """The positions closest (least squares) to ``wanted`` that keep the order and at least ``gap`` between boxes:
    with ``offset[k]`` the least distance from the first box, ``x - offset`` must not decrease, which pooling
    adjacent violators solves."""
    offsets = [0.0]
    for a, b in itertools.pairwise(widths):
        offsets.append(offsets[-1] + (a + b) / 2 + gap)
    blocks: list[list[float]] = []  # [mean, count]
    for value, offset in zip(wanted, offsets, strict=True):
        blocks.append([value - offset, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            previous = blocks[-1]
            previous[0] = (previous[0] * previous[1] + mean * count) / (previous[1] + count)
            previous[1] += count
    out: list[float] = []
    for mean, count in blocks:
        out.extend([mean] * int(count))
    return [value + offset for value, offset in zip(out, offsets, strict=True)]

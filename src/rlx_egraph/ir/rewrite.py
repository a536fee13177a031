"""GraphRewriter: edit a graph, in the spirit of torch.fx, and get a new Graph back.

The rewriter shares the input graph's immutable :class:`Node` records and keeps its
own tables (live nodes, users, outputs), so the input Graph is never changed.  Every
node it inserts is validated by :func:`check_node` (the checks ``Graph.add_node``
runs); :meth:`GraphRewriter.replace_all_uses` only swaps a value for another of the
same type, so the readers it rewires stay valid.  Identical nodes are merged (the
input's duplicates when the rewriter opens, and readers that a replacement makes
identical), as an e-graph would.  :meth:`GraphRewriter.finish` returns a Graph in a
topological order that keeps the input's order wherever nodes survive.

Each operation costs time in what it touches (the node, its inputs and users), never
in the size of the graph, so a million rewrites of a million-node graph stay linear.
:meth:`GraphRewriter.splice` does the three edits below in one batch for a part of the
graph cut out, rewritten on its own, and put back (the fallback's blocks and chains).

    rw = GraphRewriter(g)
    fused = rw.insert("FusedMatMulBiasAct", [x, w, b], act="gelu")
    rw.replace_all_uses(gelu_node, fused)
    rw.eliminate_dead_code([gelu_node])
    g2 = rw.finish()
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from .graph import Graph, GraphError, Node, check_node
from .registry import Kind

# Level gap of an inserted node over its highest input (input-graph nodes are a whole level apart).
_LEVEL_STEP = 1.0 / 1024
# Leaves whose name makes them unique: never merged, never keyed.
_NAMED_LEAVES = frozenset({"Input", "Param"})


# Attribute types that are their own key (no arrays, no floats that may be -0.0).
_OWN_KEY = frozenset({int, str, bool, tuple, type(None)})


def _value_key(value: Any) -> Any:
    """A hashable key of one attribute value (arrays by content, -0.0 apart from 0.0)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, float) and value == 0.0:
        return ("zero", math.copysign(1.0, value))
    return value


def node_key(node: Node) -> tuple | None:
    """What makes two nodes the same value: op, inputs and attributes (None for named leaves)."""
    if node.op in _NAMED_LEAVES:
        return None
    if not node.attrs:  # most ops have no attributes
        return node.op, node.inputs, ()
    return node.op, node.inputs, tuple([v if type(v) in _OWN_KEY else _value_key(v) for v in node.attrs.values()])


class GraphRewriter:
    """A mutable copy of a :class:`Graph` (see the module docstring)."""

    def __init__(self, graph: Graph) -> None:
        self.name = graph.name
        self._source = graph  # its weight store and meta go to the graph finish() returns
        self._nodes: dict[int, Node] = {}
        self._users: dict[int, dict[int, None]] = {}
        self._by_op: dict[str, dict[int, None]] = {}
        self._level: dict[int, float] = {}  # a topological numbering: inputs strictly below readers
        self._order: dict[int, tuple[float, int]] = {}  # output-order hint (input position, sequence)
        self._moved: set[int] = set()  # nodes whose order hint is not their input position
        self._keys: dict[tuple, int] = {}
        self._key_of: dict[int, tuple | None] = {}  # each live node's node_key, remembered
        self._forward: dict[int, int] = {}
        self._leaf_names: dict[str, int] = {}
        self._input_order: list[int] = []
        self._seq = 0
        self._next_id = 0
        self.touched: set[int] = set()
        """Ids inserted, erased, rewired, or whose readers changed; the owner may clear it."""
        # The views below are the rewriter's own tables, typed read-only (a MappingProxyType would
        # double the cost of the matcher's millions of lookups): never change them.
        self.nodes_by_id: Mapping[int, Node] = self._nodes
        """Live nodes by id: a read-only view that follows the edits."""
        self.readers: Mapping[int, Mapping[int, None]] = self._users
        """Each live node's readers: a read-only view that follows the edits."""
        self.leaf_names: Mapping[str, int] = self._leaf_names
        """Names of the live Input/Param leaves: a read-only view."""
        self.levels: Mapping[int, float] = self._level
        """Each live node's :meth:`level`: a read-only view that follows the edits."""
        self.keys: Mapping[int, tuple | None] = self._key_of
        """Each live node's :meth:`key`: a read-only view that follows the edits."""
        self._open(graph)

    def reopen(self, graph: Graph, levels: Sequence[float] | None = None) -> None:
        """Start over on ``graph``, keeping the table objects (and so the read-only views handed out).
        ``levels``: each node's level, in graph order (they must rise from input to reader), instead of its
        height; a part cut out of a larger graph keeps the larger graph's levels, and so its decisions."""
        for table in (self._nodes, self._users, self._by_op, self._level, self._order, self._moved, self._keys,
                      self._key_of, self._forward, self._leaf_names, self.touched):
            table.clear()
        self._input_order = []
        self._seq = 0
        self.name, self._source = graph.name, graph
        self._open(graph, levels)

    def _open(self, graph: Graph, levels: Sequence[float] | None = None) -> None:
        nodes, users, by_op, level, order, keys, key_of, forward = (
            self._nodes, self._users, self._by_op, self._level, self._order, self._keys, self._key_of, self._forward)
        for position, node in enumerate(graph.nodes):  # _add, inlined: this loop is the rewriter's opening cost
            nid, inputs = node.id, node.inputs
            if forward and not forward.keys().isdisjoint(inputs):  # reads a node merged into an identical one
                inputs = tuple(self.find(i) for i in inputs)
                node = Node(nid, node.op, inputs, node.attrs, node.shape, node.dtype, node.parts)
            key = node_key(node)
            if key is not None:
                same = keys.setdefault(key, nid)
                if same != nid:
                    forward[nid] = same
                    continue
            self._input_order.append(nid)
            nodes[nid] = node
            key_of[nid] = key
            users[nid] = {}
            by_op.setdefault(node.op, {})[nid] = None
            height = 0.0
            for i in inputs:
                users[i][nid] = None
                if level[i] >= height:
                    height = level[i] + 1.0
            level[nid] = height if levels is None else levels[position]
            order[nid] = (float(position), 0)
            if "name" in node.attrs and node.kind is Kind.LEAF:
                self._leaf_names[node.attrs["name"]] = nid
        self._next_id = max(map(attrgetter("id"), graph.nodes), default=-1) + 1  # new ids never reuse an input id
        outputs = [self.find(o) for o in graph.outputs]
        self._outputs = outputs
        self._out_uses = Counter(outputs)
        self.eliminate_dead_code([n for n, readers in users.items() if not readers])  # (the rest, in turn)
        self.touched.clear()

    # --- queries ---------------------------------------------------------------------

    def node(self, node_id: int) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise GraphError(f"no live node {node_id} in the rewriter of graph {self.name!r}") from None

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        """Live nodes, input-graph nodes first, in insertion order (not topological)."""
        return iter(list(self._nodes.values()))

    @property
    def outputs(self) -> tuple[int, ...]:
        return tuple(self._outputs)

    def users(self, node_id: int) -> list[int]:
        """Ids of the live nodes that read ``node_id`` (each once)."""
        self.node(node_id)
        return list(self._users[node_id])

    def use_count(self, node_id: int) -> int:
        """Readers plus graph-output slots holding ``node_id``."""
        readers = self._users.get(node_id)
        if readers is None:
            self.node(node_id)  # raises: not a live node
        return len(readers) + self._out_uses.get(node_id, 0)

    def is_output(self, node_id: int) -> bool:
        return self._out_uses[node_id] > 0

    def nodes_of(self, op: str) -> list[int]:
        """Live nodes of ``op`` in insertion order."""
        return list(self._by_op.get(op, ()))

    def has_op(self, op: str) -> bool:
        """Whether some live node is of ``op``."""
        return bool(self._by_op.get(op))

    @property
    def next_id(self) -> int:
        """The id :meth:`insert` gives the next new node (larger than every id so far)."""
        return self._next_id

    def level(self, node_id: int) -> float:
        """A topological number: every input of a node has a smaller one."""
        return self._level[node_id]

    def key(self, node_id: int) -> tuple | None:
        """:func:`node_key` of live node ``node_id`` (remembered: no attribute is keyed again)."""
        return self._key_of[node_id]

    def existing(self, node: Node) -> int | None:
        """The live node identical to ``node`` (same op, inputs and attributes), if any."""
        key = node_key(node)
        return None if key is None else self._keys.get(key)

    def find(self, node_id: int) -> int:
        """The node that now holds ``node_id``'s value (itself unless replaced or merged)."""
        root = node_id
        while root in self._forward:
            root = self._forward[root]
        while node_id != root:  # path compression
            self._forward[node_id], node_id = root, self._forward[node_id]
        return root

    def holders(self, node_ids: Iterable[int]) -> list[int]:
        """:meth:`find` of each of ``node_ids``, in order."""
        forward, find = self._forward, self.find
        return [find(n) if n in forward else n for n in node_ids]

    def depends_on(self, node_id: int, other: int) -> bool:
        """Whether ``node_id`` reads ``other``, directly or through other nodes (or is it)."""
        if node_id == other:
            return True
        bound = self._level[other]
        if self._level[node_id] <= bound:
            return False
        stack, seen = [node_id], {node_id}
        while stack:
            for i in self._nodes[stack.pop()].inputs:
                if i == other:
                    return True
                if i not in seen and self._level[i] > bound:
                    seen.add(i)
                    stack.append(i)
        return False

    # --- edits -------------------------------------------------------------------------

    def insert(self, op: str, inputs: Sequence[int] = (), *, before: int | None = None, reuse: bool = True,
               **attrs: Any) -> int:
        """Add ``op`` applied to ``inputs`` (validated like ``Graph.add_node``); returns its id.

        With ``reuse`` an identical live node is returned instead of a duplicate.
        ``before`` places the node ahead of that node in :meth:`finish`'s order
        (default: right after its last input); the order stays topological either way.
        """
        return self._insert(check_node(self._next_id, op, inputs, attrs, self._nodes.get, self._leaf_names),
                            before, reuse)

    def insert_checked(self, node: Node, inputs: tuple[int, ...]) -> int:
        """:meth:`insert` of a non-leaf node that :func:`check_node` validated, read from ``inputs``
        (live nodes of the types of ``node``'s inputs, e.g. those once planned); returns its id."""
        if node.kind is Kind.LEAF:
            raise GraphError(f"insert_checked takes no leaves: {node.op} is one (insert checks its name)")
        return self._insert(Node(self._next_id, node.op, inputs, node.attrs, node.shape, node.dtype, node.parts),
                            None, True)

    def _insert(self, node: Node, before: int | None, reuse: bool) -> int:
        key = node_key(node)
        if reuse and key is not None and key in self._keys:
            return self._keys[key]
        if before is not None:
            self.node(before)  # raises: not a live node
            position = self._order[before][0] - 0.5
        else:
            position = max([self._order[i][0] for i in node.inputs], default=-1.0) + 0.5
        self._next_id += 1
        self._seq += 1
        self._add(node, key, (position, self._seq))
        self._moved.add(node.id)
        return node.id

    def replace_all_uses(self, old: int, new: int, skip: Container[int] = ()) -> None:
        """Make every reader and output slot of ``old`` use ``new`` instead.

        ``new`` must have ``old``'s type and must not read ``old`` (that would be a
        cycle).  ``old`` stays in place, unused: erase it or run dead-code elimination.
        Readers that become identical to another node are merged into it.  Readers in
        ``skip`` keep reading ``old``: nodes the caller drops next (rewiring them would be
        wasted), so that ``old`` dies with them.
        """
        pending = [(old, new)]
        duplicates: list[int] = []
        while pending:
            old, new = pending.pop()
            if old == new or old not in self._nodes:
                continue
            a, b = self.node(old), self.node(new)
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                raise GraphError(f"cannot replace node {old} ({a.op}, {a.type}) by node {new} ({b.op}, {b.type}): "
                                 "their types differ")
            if self.depends_on(new, old):
                raise GraphError(f"cannot replace node {old} ({a.op}) by node {new} ({b.op}): node {new} reads "
                                 f"node {old}, so the graph would have a cycle")
            for u in list(self._users[old]):
                if u in skip:
                    continue
                same = self._rewire(u, old, new)
                if same is not None:
                    pending.append((u, same))
                    duplicates.append(u)
            if old in self._out_uses:
                self._outputs = [new if o == old else o for o in self._outputs]
                self._out_uses[new] += self._out_uses.pop(old)
            self._held_by(old, new)
            self._raise_levels(new)
        if duplicates:
            self.eliminate_dead_code(duplicates)

    def splice(self, part: Graph, back: Mapping[int, int], holders: Mapping[int, int]
               ) -> tuple[dict[int, int], list[int], list[tuple[int, int, int]]]:
        """Replace a part of the graph by ``part``, its rewritten form (one batch of :meth:`insert`,
        :meth:`replace_all_uses` and :meth:`eliminate_dead_code`).

        The part was cut out as a graph of its own and rewritten (by a rewriter of its own, say): ``back`` maps
        its nodes as cut out to the live nodes they copy; ``part`` has the id of each of them that it still holds
        (that node, perhaps rewired to other inputs) and other ids for its new nodes; ``holders`` maps each node as
        cut out to the node of ``part`` that holds its value.  A node of ``part`` that is a leaf, or reads what the
        live node it copies reads, stays that node; the others are inserted (checked, as the part was); each value
        the rest of the graph reads is replaced by its holder, and the live nodes the part drops die (their reads
        of a replaced value are not rewired first).  A holder of another type than its value raises GraphError
        before any edit.  Returns the live id of each node of ``part``, the nodes of ``part`` that are new nodes,
        and the replacements (old live id, new live id, the holder in ``part``), in order."""
        nodes, users, out_uses = self._nodes, self._users, self._out_uses
        part_nodes = part.nodes_by_id
        for cut, now in holders.items():  # before any edit: a part that cannot go in leaves the graph as it is
            if now == cut:  # that node, perhaps rewired: of its own type
                continue
            was, holder = nodes.get(back[cut]), part_nodes[now]
            if was is not None and (was.shape, was.dtype) != (holder.shape, holder.dtype):
                raise GraphError(f"cannot splice: node {was.id} ({was.op}, {was.type}) would be held by the part's "
                                 f"node {now} ({holder.op}, {holder.type}): their types differ")
        made: dict[int, int] = {}
        new: list[int] = []
        for node in part.nodes:  # in topological order
            inputs = tuple([made[i] for i in node.inputs])
            copied = back.get(node.id)
            if copied is not None:
                was = nodes[copied]
                if node.kind is Kind.LEAF or (was.op, was.inputs) == (node.op, inputs):
                    made[node.id] = copied
                    continue
            first_new = self._next_id
            if node.kind is Kind.LEAF:
                made[node.id] = self.insert(node.op, inputs, **node.attrs)
            else:
                made[node.id] = self._insert(
                    Node(first_new, node.op, inputs, node.attrs, node.shape, node.dtype, node.parts), None, True)
            if made[node.id] >= first_new:
                new.append(node.id)
        kept = set(made.values())
        dropped = [live for cut in sorted(back, reverse=True) if (live := back[cut]) not in kept]
        skip = set(dropped)
        replaced: list[tuple[int, int, int]] = []
        for cut, now in holders.items():  # in topological order: each value to where the part keeps it
            old, rep = back[cut], made[now]
            if old == rep or old not in nodes:
                continue
            if old in out_uses or not skip.issuperset(users[old]):
                self.replace_all_uses(old, rep, skip)
            else:  # nothing to rewire (nor a cycle to fear; the types are checked): what replace_all_uses does then
                self._held_by(old, rep)
            replaced.append((old, rep, now))
        self.eliminate_dead_code(dropped + [old for old, _, _ in replaced])
        return made, new, replaced

    def erase(self, node_id: int) -> None:
        """Remove an unused node (its inputs stay, even if now unused)."""
        node = self.node(node_id)
        if self._users[node_id] or self._out_uses[node_id]:
            readers = list(self._users[node_id]) + (["an output"] if self._out_uses[node_id] else [])
            raise GraphError(f"cannot erase node {node_id} ({node.op}): it is still used by {readers}")
        self._remove(node)

    def eliminate_dead_code(self, candidates: Iterable[int] | None = None) -> list[int]:
        """Erase unused nodes among ``candidates`` (default: all) and, in turn, the inputs
        they leave unused; graph inputs are kept.  Returns the erased ids."""
        stack = list(self._nodes if candidates is None else candidates)
        stack.reverse()
        erased: list[int] = []
        nodes, users, out_uses = self._nodes, self._users, self._out_uses
        while stack:
            nid = stack.pop()
            node = nodes.get(nid)
            if node is None or users[nid] or nid in out_uses or node.op == "Input":
                continue
            self._remove(node)
            erased.append(nid)
            stack.extend(reversed(node.inputs))
        return erased

    def finish(self) -> Graph:
        """A new, valid Graph of the live nodes with the same outputs, topologically ordered."""
        live, moved = self._nodes, self._moved
        unmoved = [nid for nid in self._input_order if nid in live and nid not in moved]  # in order already
        # one stable sort of the two runs (a merge, done by sorted in C): on a tie, the unmoved node first
        order = sorted(unmoved + [nid for nid in moved if nid in live], key=self._order.__getitem__)
        ordered: list[Node] = []
        done: set[int] = set()
        for nid in order:
            if nid in done:
                continue
            if done.issuperset(live[nid].inputs):  # most nodes: their inputs are placed already
                done.add(nid)
                ordered.append(live[nid])
                continue
            stack = [nid]
            while stack:  # inputs first
                top = stack[-1]
                waiting = [i for i in live[top].inputs if i not in done]
                if waiting:
                    stack.extend(reversed(waiting))
                    continue
                stack.pop()
                if top not in done:
                    done.add(top)
                    ordered.append(live[top])
        out = Graph.from_checked(self.name, ordered)  # each node checked when it was opened or inserted
        out.set_outputs(self._outputs)
        out.adopt_store(self._source)
        return out

    # --- internals -----------------------------------------------------------------------

    def _add(self, node: Node, key: tuple | None, order: tuple[float, int]) -> None:
        nid, inputs, users, level = node.id, node.inputs, self._users, self._level
        self._nodes[nid] = node
        users[nid] = {}
        self._by_op.setdefault(node.op, {})[nid] = None
        for i in inputs:
            users[i][nid] = None
        # Just above the highest input (inserted nodes): a node that replaces one of the same
        # inputs' readers then rarely sits higher than it, so replacements rarely raise levels.
        level[nid] = max([level[i] for i in inputs], default=-1.0) + _LEVEL_STEP
        self._order[nid] = order
        self._key_of[nid] = key
        if key is not None:
            self._keys[key] = nid
        if "name" in node.attrs and node.kind is Kind.LEAF:
            self._leaf_names[node.attrs["name"]] = nid
        self.touched.update((nid, *inputs))

    def _remove(self, node: Node) -> None:
        nid, inputs, users = node.id, node.inputs, self._users
        del self._nodes[nid], users[nid], self._by_op[node.op][nid], self._level[nid], self._order[nid]
        self._moved.discard(nid)
        key = self._key_of.pop(nid)
        if key is not None and self._keys.get(key) == nid:
            del self._keys[key]
        if "name" in node.attrs and node.kind is Kind.LEAF:
            del self._leaf_names[node.attrs["name"]]
        for i in inputs:
            users[i].pop(nid, None)
        self._out_uses.pop(nid, None)
        self.touched.update((nid, *inputs))

    def _held_by(self, old: int, new: int) -> None:
        """Note that ``new`` now holds ``old``'s value (``old``'s readers and output slots moved over)."""
        self._forward[old] = new
        self._order[new] = min(self._order[new], self._order[old])
        self._moved.add(new)
        self.touched.update((old, new))

    def _rewire(self, user: int, old: int, new: int) -> int | None:
        """Point ``user``'s ``old`` inputs at ``new``; returns the live node it now duplicates, if any."""
        node = self._nodes[user]
        inputs = tuple([new if i == old else i for i in node.inputs])
        if node.kind is Kind.WEIGHT_PREP:  # its inputs' ops matter, not only their types
            check_node(user, node.op, inputs, node.attrs, self._nodes.get, {})
        old_key = self._key_of[user]
        if old_key is not None and self._keys.get(old_key) == user:
            del self._keys[old_key]
        self._nodes[user] = Node(user, node.op, inputs, node.attrs, node.shape, node.dtype, node.parts)
        del self._users[old][user]
        self._users[new][user] = None
        self.touched.update((user, old, new))
        if old_key is None:
            return None
        key = self._key_of[user] = (old_key[0], inputs, old_key[2])  # node_key of the rewired node
        same = self._keys.setdefault(key, user)
        return same if same != user else None

    def _raise_levels(self, start: int) -> None:
        """Restore ``level(input) < level(reader)`` above ``start`` after a rewiring."""
        stack = [start]
        while stack:
            nid = stack.pop()
            floor = self._level[nid] + _LEVEL_STEP
            for u in self._users[nid]:
                if self._level[u] < floor:
                    self._level[u] = floor
                    stack.append(u)


__all__ = ["GraphRewriter", "node_key"]

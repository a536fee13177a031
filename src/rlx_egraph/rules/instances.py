"""Random instances of a rule's query: IR graphs on which the rule can match, drawn from the rule model.

:class:`InstanceBuilder` turns a list of query atoms into a random graph: each
op term a node, each ``Op`` variable an Input or Param leaf, each attribute
variable a random value of its sort.  Shapes, dtypes and values that guards
pin down are solved from the guards (:data:`.primitives.PRIMITIVES` and
:data:`.tables.FACT_TABLES` give them their meaning), the rest drawn until the
registry's shape rules and the guards accept them; an op with a registry
``sampler`` half the time takes its leaves' shapes and its attributes from a
sample whose dims are renamed to those of the inputs already built, so fused
ops such as FusedAttentionBlock can be built; ``?w = (Param ?n ?s ?dt)`` is a
leaf drawn with its reader, ``?s`` and ``?dt`` its shape and dtype.  Whether
the query really matches is left to the engine that runs the rule.

Helper relations: :func:`unfold` replaces a relation fact of the query by the
query of a rule that adds that row (:func:`helper_producers`), so the instance holds
the whole decomposed form; :func:`readers` lists the rules whose unfolded
queries can hold a facts-only rule's query.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..ir.graph import Graph, GraphError
from ..ir.registry import INDEX_DTYPE, REGISTRY, AttrType, Kind, ShapeError, TensorType
from .model import (
    RULE,
    Atom,
    Fact,
    Guard,
    Insert,
    Pattern,
    Rule,
    SetValue,
    atom_terms,
    equation,
    rename_atom,
    tables_of,
)
from .primitives import PRIMITIVES, NoValue, same_value
from .ruleset import RuleSet
from .signatures import OP, TENSOR_LIST, constructor_args
from .tables import ATTENTION_BLOCK_MAX_TOKENS, FACT_TABLES
from .terms import (
    F64,
    I64,
    STRING,
    Absent,
    Call,
    Lit,
    Lookup,
    OpTerm,
    TensorList,
    Term,
    Var,
    children,
    rename,
    subterms,
    variables,
)

FLOATS = ("f32", "f32", "f16", "bf16")  # instance dtypes (f32 twice as likely)
TERM_RETRIES = 60  # draws of one term before it gives up
DEGENERATE_RETRIES = 12  # draws of one term its op calls degenerate (OpSpec.degenerate) before one is kept
MAX_TERM_DRAWS = 600  # draws of all terms of one instance (retries of nested terms multiply)
MAX_UNFOLDING = 8  # helper relations unfolded inside one another
_NOT_BOUND = object()  # what the builder's environment gives for a variable it does not hold

Producers = dict[str, list[tuple[Rule, Insert | SetValue]]]  # helper table -> (rule, action adding a row to it)


class NoInstance(Exception):
    """This random draw does not satisfy the query: draw another (the message says why).

    The message is ``why``, or the format string ``why`` filled with ``parts`` when it is read: most failed
    draws are drawn again without their message being read, and writing out a term costs more than the draw."""

    def __init__(self, why: str, *parts: Any) -> None:
        super().__init__(why, *parts)

    def __str__(self) -> str:
        why, *parts = self.args
        return why.format(*parts) if parts else why


class _Unknown(Exception):
    """A term depends on something not built or bound yet."""


@dataclass(frozen=True)
class _Unbound:
    """What evaluating a term that waits for variable ``name`` gives (cheaper than raising _Unknown: the guards
    are evaluated again after every draw)."""

    name: str


class _Degenerate(Exception):
    """This term's dims leave a parameter of its op without effect (``OpSpec.degenerate``): draw it again."""


# --- rules, their queries and the helper relations that join them ------------------------------------------------


def unions_nothing(rule: Rule) -> bool:
    """A rule (not a rewrite) whose actions add facts but union nothing (and do not panic)."""
    return rule.facts_only


def queries(rule: Rule) -> list[tuple[Atom, ...]]:
    """The query of each way ``rule`` runs (a rewrite's root is ``?rewrite-root``; a birewrite has two)."""
    return [d.query for d in rule.directions]


def helper_producers(ruleset: RuleSet) -> Producers:
    """Helper table -> (rule, action) for every action of a rule that adds a row to a relation, or sets a value
    of a helper function."""
    out: Producers = {}
    for rule in ruleset.rules:
        if rule.kind != RULE:
            continue
        for action in rule.actions:
            if isinstance(action, Insert) or (isinstance(action, SetValue) and action.table not in FACT_TABLES):
                out.setdefault(action.table, []).append((rule, action))
    return out


def tables_read(rule: Rule) -> set[str]:
    """The tables any direction of ``rule`` reads."""
    return {t for query in queries(rule) for atom in query for t in tables_of(atom_terms(atom))}


def set_tables(rule: Rule, producers: Producers) -> set[str]:
    """Tables filled with ``set`` that ``rule``'s query reads."""
    set_filled = {t for t, ps in producers.items() if any(isinstance(a, SetValue) for _, a in ps)}
    return rule.tables_read & set_filled


def readers(ruleset: RuleSet, producers: Producers) -> dict[str, list[Rule]]:
    """Each facts-only rule (by name) -> the union rules whose query, unfolded, can hold its query (none for one
    that reads tables filled with ``set``, and no reader that does)."""
    read = {r.name: tables_read(r) for r in ruleset.rules}
    reads_set = {r.name for r in ruleset.rules if set_tables(r, producers)}

    def fills(r: Rule) -> set[str]:
        return {t for t, ps in producers.items() if any(p.name == r.name for p, _ in ps)}

    def of(rule: Rule) -> list[Rule]:
        tables, seen, out = fills(rule), {rule.name}, []
        changed = True
        while changed:
            changed = False
            for r in ruleset.rules:
                if r.name in seen or not read[r.name] & tables or r.name in reads_set:
                    continue
                seen.add(r.name)
                changed = True
                if unions_nothing(r):
                    tables |= fills(r)
                else:
                    out.append(r)
        return out

    return {r.name: of(r) for r in ruleset.rules if unions_nothing(r) and r.name not in reads_set}


def reads_relation(rule: Rule, producers: Producers) -> bool:
    """Whether ``rule``'s query holds a relation fact that :func:`unfold` would replace."""
    return any(_unfoldable(atom, producers) for atom in rule.query)


def _unfoldable(atom: Atom, producers: Producers) -> bool:
    return isinstance(atom, Fact) and atom.value is None and atom.table in producers


def literals(atoms: list[Atom]) -> dict[str, list[Any]]:
    """The query's literals by sort, to draw attribute values from (a guard ``?c ~ 1.414`` needs 1.414)."""
    out: dict[str, list[Any]] = {I64: [], F64: [], STRING: []}
    for atom in reversed(atoms):  # last written first
        for term in reversed(atom_terms(atom)):
            for t in reversed(list(subterms(term))):
                if isinstance(t, Lit) and t.sort in out:
                    out[t.sort].append(t.value)
    return out


def fresh(atoms: list[Atom], tag: str, keep: frozenset[str] | set[str] = frozenset()) -> list[Atom]:
    """``atoms`` with every variable not in ``keep`` renamed apart (suffix ``tag``)."""
    names = {v for atom in atoms for term in atom_terms(atom) for v in variables(term)} - set(keep)
    names_to = {v: Var(f"{v}#{tag}") for v in names}
    return [rename_atom(atom, names_to) for atom in atoms]  # type: ignore[arg-type]


def choose_producers(atoms: tuple[Atom, ...] | list[Atom], producers: Producers, counts: dict[str, float],
                     used: set[str], depth: int = 0) -> list[int]:
    """The producer :func:`unfold` replaces each helper-relation fact of ``atoms`` by, depth first (the facts of a
    producer's query after its own): its index in ``producers[table]``, the least used so far (per ``counts``,
    updated) first, so every producer gets its turn; ``used`` collects the rules chosen.  No rule is renamed:
    the choice is cheap, and the same choices unfold to the same atoms."""
    out: list[int] = []
    for atom in atoms:
        if not _unfoldable(atom, producers):
            continue
        assert isinstance(atom, Fact)
        if depth > MAX_UNFOLDING:
            raise NoInstance(f"helper relation {atom.table} nests too deep")
        options = producers[atom.table]
        k = min(range(len(options)), key=lambda k: (counts.get(options[k][0].name, 0), k))
        rule = options[k][0]
        counts[rule.name] = counts.get(rule.name, 0) + 1
        used.add(rule.name)
        out.append(k)
        out += choose_producers(rule.query, producers, counts, used, depth + 1)
    return out


def unfold(atoms: list[Atom], producers: Producers, choices: Iterator[int], used: set[str] | None = None,
           depth: int = 0) -> list[Atom]:
    """Replace each helper-relation fact by the query of the rule that adds its row that ``choices`` names (see
    :func:`choose_producers`), renamed apart; ``used`` collects the rules unfolded."""
    used = set() if used is None else used
    out: list[Atom] = []
    for atom in atoms:
        if not _unfoldable(atom, producers):
            out.append(atom)
            continue
        assert isinstance(atom, Fact)
        rule, action = producers[atom.table][next(choices)]
        used.add(rule.name)
        *query, head = fresh([*rule.query, Fact(action.table, action.args)], f"{depth}.{len(out)}.{len(used)}")
        assert isinstance(head, Fact)
        names: dict[str, Term] = {}
        for produced, read in zip(head.args, atom.args, strict=True):
            if isinstance(produced, Var) and produced.name not in names:
                names[produced.name] = read
            else:
                out.append(equation(rename(produced, names), read))
        out.extend(unfold([rename_atom(a, names) for a in query], producers, choices, used, depth + 1))
    return out


# --- building an instance ------------------------------------------------------------------------------------


def _definition(atom: Atom) -> tuple[str, OpTerm] | None:
    """``(var, term)`` when ``atom`` is ``(= ?var (Op ...))`` as written."""
    if isinstance(atom, Pattern) and isinstance(atom.var, Var) and isinstance(atom.term, OpTerm):
        return atom.var.name, atom.term
    return None


def merge_definitions(atoms: list[Atom]) -> list[Atom]:
    """Unify two definitions of one variable by the same constructor (a join two unfoldings share)."""
    while True:
        defs: dict[str, OpTerm] = {}
        for k, atom in enumerate(atoms):
            if not (isinstance(atom, Pattern) and atom.var_first and (found := _definition(atom))):
                continue
            var, term = found
            if var not in defs:
                defs[var] = term
                continue
            names: dict[str, Term] = {}
            if _unify(defs[var], term, names):
                atoms = [rename_atom(a, names) for j, a in enumerate(atoms) if j != k]
                break
        else:
            return atoms


def _head(term: Term) -> tuple[Any, ...] | None:
    """What two terms must share to unify argument by argument (None: a variable or a literal)."""
    if isinstance(term, OpTerm):
        return ("op", term.op, len(term.args))
    if isinstance(term, Call):
        return ("call", term.name, len(term.args))
    if isinstance(term, Lookup):
        return ("lookup", term.table, len(term.args))
    if isinstance(term, TensorList):
        return ("list", len(term.items), term.rest is None)
    return None


def _unify(a: Term, b: Term, names: dict[str, Term]) -> bool:
    """Extend ``names`` (variables of ``b`` -> parts of ``a``) so ``b`` reads as ``a``; False if it cannot."""
    if isinstance(b, Var):
        if b.name in names:
            return names[b.name] == a
        names[b.name] = a
        return True
    head = _head(a)
    if head is not None and head == _head(b):
        return all(_unify(x, y, names) for x, y in zip(children(a), children(b), strict=True))
    return a == b


class _InstanceFacts:
    """The fact tables' source (:class:`.tables.FactSource`) over the graph being built."""

    attention_block_max_tokens = ATTENTION_BLOCK_MAX_TOKENS

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def node(self, nid: int) -> Any:
        try:
            return self.graph.node(nid)
        except GraphError:
            raise NoValue from None

    def param_order(self, nid: int) -> int:
        ids = [n.id for n in self.graph.params]
        if nid not in ids:
            raise NoValue
        return ids.index(nid)


# A guard of the builder: an equation (left, right), or (term,), a check that holds where the term has a value.
_Guard = tuple[Term, Term] | tuple[Term]


def _as_guard(atom: Atom) -> _Guard:
    if isinstance(atom, Guard):
        return atom.args if atom.name == "=" else (Call(atom.name, atom.args),)  # type: ignore[return-value]
    return atom_terms(atom)  # type: ignore[return-value]


@dataclass(frozen=True)
class Query:
    """A list of query atoms made ready for drawing instances (:func:`prepare`): what no random draw changes.

    Built once, it serves every draw: the builder only reads it."""

    defs: dict[str, OpTerm]  # var -> the op term that defines it (leaf definitions taken out, see _leaf_defs)
    guards: tuple[_Guard, ...]
    sorts: dict[str, str]  # var -> its sort
    leaf_op: dict[str, str]  # var defined as an Input/Param term -> that op
    leaf_name: dict[str, Term]  # such a var -> its name argument (a literal or a variable)
    targets: frozenset[str]  # variables a guard may solve (shapes and dtypes of leaves, equated variables)
    literals: dict[str, list[Any]]  # the atoms' literals by sort (see :func:`literals`)
    refuted: str = ""  # why no draw can make an instance (a guard false before anything is drawn); "" if none


def prepare(atoms: list[Atom]) -> Query:
    """``atoms`` ready for :func:`build_instance`: definitions merged and split from guards, variables sorted,
    leaf definitions made leaves, and the guards found false before anything is drawn (every draw would fail
    there, with the same message)."""
    defs: dict[str, OpTerm] = {}
    guards: list[_Guard] = []
    sorts: dict[str, str] = {}
    for atom in merge_definitions(atoms):
        if (found := _definition(atom)) and found[0] not in defs:
            defs[found[0]] = found[1]
        else:
            guards.append(_as_guard(atom))
        for term in atom_terms(atom):
            _sort_vars(term, sorts)
    for v in defs:
        sorts[v] = OP
    leaf_op: dict[str, str] = {}
    leaf_name: dict[str, Term] = {}
    defs, guards = _leaf_defs(defs, guards, leaf_op, leaf_name)
    targets = {t.args[0].name for g in guards for t in g
               if isinstance(t, Lookup) and t.table in ("shape", "dtype") and isinstance(t.args[0], Var)}
    targets |= {t.name for g in guards if len(g) == 2 for t in g if isinstance(t, Var)}
    query = Query(defs, tuple(guards), sorts, leaf_op, leaf_name, frozenset(targets), literals(atoms))
    try:  # the first pass of every build: nothing bound yet, so no draw changes what it finds
        InstanceBuilder(query).solve_guards()
    except NoInstance as exc:
        return replace(query, refuted=str(exc))
    return query


def _leaf_defs(defs: dict[str, OpTerm], guards: list[_Guard], leaf_op: dict[str, str],
               leaf_name: dict[str, Term]) -> tuple[dict[str, OpTerm], list[_Guard]]:
    """Make ``?w = (Param ?n ?s ?dt)`` (or Input) a leaf drawn with the term that reads it: ``?s`` and
    ``?dt`` stand for ``(shape ?w)`` and ``(dtype ?w)`` everywhere; a literal or reused one becomes a guard.
    Fills ``leaf_op`` and ``leaf_name``; returns the definitions and guards left."""
    names: dict[str, Term] = {}
    pinned: list[_Guard] = []
    for var, term in list(defs.items()):
        spec = REGISTRY[term.op]
        if spec.kind is not Kind.LEAF or "name" not in spec.attr_names:
            continue
        del defs[var]
        leaf_op[var] = term.op
        for arg, a in zip(constructor_args(spec), term.args, strict=True):
            if arg.name == "name":
                leaf_name[var] = a
                continue
            of_leaf = Lookup(arg.name, (Var(var),))
            if isinstance(a, Var) and a.name not in names and a.name not in defs:
                names[a.name] = of_leaf
            else:
                pinned.append((of_leaf, a))
    if not leaf_op:
        return defs, guards
    guards = [tuple(rename(t, names) for t in g) for g in [*guards, *pinned]]  # type: ignore[misc]
    return {v: rename(t, names) for v, t in defs.items()}, guards  # type: ignore[misc]


def _sort_vars(term: Term, sorts: dict[str, str]) -> None:
    """Record in ``sorts`` the sort of each variable ``term`` applies to an argument of known sort."""
    if isinstance(term, OpTerm):
        arg_sorts = [a.sort for a in constructor_args(REGISTRY[term.op])]
    elif isinstance(term, TensorList):
        arg_sorts = [OP] * len(term.items) + [TENSOR_LIST]
    elif isinstance(term, Lookup) and term.table in FACT_TABLES:
        arg_sorts = list(FACT_TABLES[term.table].inputs)
    else:
        arg_sorts = []
    for a, sort in zip(children(term), arg_sorts, strict=False):
        if isinstance(a, Var):
            sorts.setdefault(a.name, sort)
    for a in children(term):
        _sort_vars(a, sorts)


class InstanceBuilder:
    """A random graph for a prepared query: op-term definitions become nodes, guards are solved or checked."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.defs, self.guards, self.sorts = query.defs, query.guards, query.sorts
        self.leaf_op, self.leaf_name, self.targets, self.literals = (query.leaf_op, query.leaf_name, query.targets,
                                                                     query.literals)
        self.graph = Graph("instance")
        self.facts = _InstanceFacts(self.graph)
        self.env: dict[str, Any] = {}  # var -> node id (Op), list of node ids (TensorList) or value
        self.leaf_shape: dict[str, tuple[int, ...]] = {}
        self.leaf_dtype: dict[str, str] = {}
        self.held: set[int] = set()  # guards found to hold (by index)
        self.draws = 0  # term draws of this instance (at most MAX_TERM_DRAWS)
        self.names = itertools.count()

    # -- evaluation of guard terms --

    def value(self, term: Term) -> Any:
        """The value of a term over what is built and bound so far (_Unknown when it depends on more)."""
        value = self._value(term)
        if isinstance(value, _Unbound):
            raise _Unknown(value.name)
        return value

    def _value(self, term: Term) -> Any:
        """:meth:`value`, or an _Unbound naming the first variable (left to right) the term waits for."""
        if isinstance(term, Lit):
            return term.value
        if isinstance(term, Var):
            value = self.env.get(term.name, _NOT_BOUND)
            return _Unbound(term.name) if value is _NOT_BOUND else value
        if isinstance(term, Lookup):
            return self._lookup(term)
        if not isinstance(term, Call) or term.name not in PRIMITIVES:
            raise NoInstance("cannot evaluate {}", term)
        args = self._values(term.args)
        if isinstance(args, _Unbound):
            return args
        try:
            return PRIMITIVES[term.name](*args)
        except (IndexError, ZeroDivisionError, TypeError) as exc:
            raise NoInstance(f"{term.name}: {exc}") from None

    def _values(self, terms: tuple[Term, ...]) -> list[Any] | _Unbound:
        """The values of ``terms``, evaluated left to right up to the first that waits for a variable."""
        out = []
        for term in terms:
            value = self._value(term)
            if isinstance(value, _Unbound):
                return value
            out.append(value)
        return out

    def _lookup(self, term: Lookup) -> Any:
        table, args = term.table, term.args
        if table in ("shape", "dtype") and isinstance(args[0], Var) and args[0].name not in self.env:
            drawn = self.leaf_shape if table == "shape" else self.leaf_dtype
            if args[0].name in drawn:  # a leaf not built yet whose type is drawn or solved
                return drawn[args[0].name]
        if table not in FACT_TABLES:
            raise NoInstance(f"cannot evaluate {table}")
        values = self._values(args)
        return values if isinstance(values, _Unbound) else FACT_TABLES[table].evaluate(self.facts, *values)

    def _known(self, term: Term) -> tuple[bool, Any]:
        """``(True, value)``, or ``(False, None)`` when it depends on something not built or bound yet; a term
        without a value (NoValue) does not hold: NoInstance."""
        try:
            value = self._value(term)
        except NoValue:
            raise NoInstance("{} has no value", term) from None
        return (False, None) if isinstance(value, _Unbound) else (True, value)

    def _assign(self, term: Term, value: Any) -> bool:
        """Make ``term`` (a free variable, or the shape/dtype of an unbuilt leaf) equal ``value``."""
        if isinstance(term, Var) and term.name not in self.env and term.name not in self.defs:
            if self.sorts.get(term.name) == OP:
                return False
            self.env[term.name] = value
            return True
        if isinstance(term, Lookup) and term.table in ("shape", "dtype") and isinstance(term.args[0], Var):
            var = term.args[0].name
            drawn = self.leaf_shape if term.table == "shape" else self.leaf_dtype
            if var not in self.env and var not in drawn:
                drawn[var] = tuple(value) if term.table == "shape" else value
                return True
        return False

    def solve_guards(self) -> bool:
        """Assign what the guards pin down; NoInstance when a guard is known not to hold.

        A guard found to hold is not evaluated again: what it reads stays bound (bindings are only added, and
        taken back only with :attr:`held`, when a term is drawn again)."""
        progress = False
        for k, guard in enumerate(self.guards):
            if k in self.held:
                continue
            if len(guard) == 2:
                left, right = guard  # type: ignore[misc]
                (lk, lv), (rk, rv) = self._known(left), self._known(right)
                if lk and rk:
                    if not same_value(_tuple(lv), _tuple(rv)):
                        raise NoInstance("guard (= {} {}) does not hold", left, right)
                    self.held.add(k)
                elif lk:
                    progress |= self._assign(right, lv)
                elif rk:
                    progress |= self._assign(left, rv)
            else:
                (term,) = guard
                progress |= self._solve_check(term)
                try:
                    waits = isinstance(self._value(term), _Unbound)
                except NoValue:
                    raise NoInstance("guard {} does not hold", term) from None
                if not waits:
                    self.held.add(k)
        return progress

    def _solve_check(self, term: Term) -> bool:
        """Solve the checks that pin a free variable: ``(< (abs (- ?c L)) eps)`` and ``(inverse-perms ?p ?q)``."""
        if isinstance(term, Call) and term.name == "<" and isinstance(a := term.args[0], Call) and a.name == "abs" \
                and isinstance(d := a.args[0], Call) and d.name == "-":
            var, target = d.args
            known, value = self._known(target)
            return known and self._assign(var, value)
        if isinstance(term, Lookup) and term.table == "inverse-perms":
            known, p = self._known(term.args[0])
            return known and self._assign(term.args[1], tuple(sorted(range(len(p)), key=p.__getitem__)))
        return False

    # -- building terms --

    def build(self, rng: np.random.Generator) -> Graph:
        """The instance drawn with ``rng``: every definition built, every guard holding; NoInstance when this draw
        fails."""
        self.rng = rng
        self.dtype = FLOATS[int(rng.integers(len(FLOATS)))]
        if self.query.refuted:
            raise NoInstance(self.query.refuted)
        pending = list(self.defs)
        while pending:
            self.solve_guards()
            ready = [v for v in pending if self._ready(self.defs[v], strict=True)]
            if not ready:
                ready = [v for v in pending if self._ready(self.defs[v], strict=False)][:1]
            if not ready:
                raise NoInstance("the term definitions are cyclic")
            for v in ready:
                self.env[v] = self.term(self.defs[v])
                pending.remove(v)
        self.solve_guards()
        users = {i for n in self.graph.nodes for i in n.inputs}
        self.graph.set_outputs([n.id for n in self.graph.nodes if n.id not in users and n.kind is not Kind.LEAF])
        if not self.graph.outputs:
            raise NoInstance("the left side computes nothing")
        return self.graph

    def _ready(self, term: Term, strict: bool) -> bool:
        """All defined children built; with ``strict``, no leaf or attribute waits for a guard either."""
        if isinstance(term, Var):
            name = term.name
            if name in self.env:
                return True
            if name in self.defs:
                return False
            return not (strict and name in self.targets)
        return all(self._ready(a, strict) for a in children(term))

    def term(self, term: Term) -> int:
        """Build an op term (its undefined leaves and free attributes drawn until it is valid)."""
        if isinstance(term, Var):
            return self.leaf(term.name, None)
        if not isinstance(term, OpTerm):
            raise NoInstance("{} is not an op term", term)
        spec = REGISTRY[term.op]
        args = constructor_args(spec)
        degenerate = 0  # draws rejected as degenerate: past DEGENERATE_RETRIES the rule may need one (a literal)
        for _ in range(TERM_RETRIES):
            self.draws += 1
            if self.draws > MAX_TERM_DRAWS:  # nested retries multiply: a deep pattern gives up, not hangs
                raise NoInstance(f"no instance within {MAX_TERM_DRAWS} term draws")
            saved = dict(self.env), dict(self.leaf_shape), dict(self.leaf_dtype), set(self.held)
            try:
                return self._try_term(term, spec, args, degenerate < DEGENERATE_RETRIES)
            except _Degenerate as exc:
                degenerate += 1
                last: Exception = exc
                self.env, self.leaf_shape, self.leaf_dtype, self.held = saved
            except (ShapeError, GraphError, _Unknown, NoInstance) as exc:
                last = exc
                self.env, self.leaf_shape, self.leaf_dtype, self.held = saved
        raise NoInstance("no valid {}: {}", term.op, last)

    def _try_term(self, term: OpTerm, spec: Any, args: Any, informative: bool = False) -> int:
        """One draw of ``term``; ``informative``: refuse dims its op calls degenerate (_Degenerate)."""
        free_leaves: list[str] = []
        drawn: dict[str, Any] = {}
        inputs: list[Any] = []  # node id, or the variable of a leaf to create
        attrs: dict[str, Any] = {}
        kinds = {a.name: a for a in spec.attrs}
        named: list[tuple[str, Any]] = []  # (input name, item) of the non-variadic inputs
        for arg, a in zip(args, term.args, strict=True):
            if arg.is_input:
                for item in self._input_items(a, arg.variadic):
                    if isinstance(item, str) and item not in self.env:
                        free_leaves.append(item)
                    inputs.append(item)
                    if not arg.variadic:
                        named.append((arg.name, item))
        types: dict[str, TensorType] = {}
        free_leaves = [v for v in dict.fromkeys(free_leaves) if v not in self.env]  # not built by a nested term
        sampled, sampled_attrs = self._sampled(spec, named) if spec.sampler and self.rng.random() < 0.5 else ({}, {})
        for arg, a in zip(args, term.args, strict=True):
            if not arg.is_input and arg.name in sampled_attrs and isinstance(a, Var) and a.name not in self.env:
                drawn.setdefault(a.name, sampled_attrs[arg.name])
        for var in free_leaves:  # each drawn shape goes through the guards to the next leaves
            self.leaf_shape.setdefault(var, sampled[var] if var in sampled else self._draw_shape())
            self.solve_guards()
        index_leaves = {item for name, item in named if name in spec.index_inputs}  # integer ids
        for var in dict.fromkeys(free_leaves):
            types[var] = TensorType(self.leaf_shape[var], INDEX_DTYPE if var in index_leaves
                                    else self.leaf_dtype.get(var, self.dtype))
        in_types = [types[i] if isinstance(i, str) and i in types else self.graph.node(self._id(i)).type
                    for i in inputs]
        for arg, a in zip(args, term.args, strict=True):
            if not arg.is_input:
                attrs[arg.name] = self._attr(a, kinds[arg.name], drawn, in_types)
        canonical, _ = spec.resolve(attrs, in_types)
        if informative and spec.degenerate is not None and (why := spec.degenerate(canonical, in_types)):
            raise _Degenerate(why)
        if spec.kind is Kind.WEIGHT_PREP and any(isinstance(i, int) and self.graph.node(i).op != "Param"
                                                 for i in inputs):
            raise ShapeError("weight preparation reads parameters only")
        for var, t in types.items():
            self.env[var] = self._leaf_node(var, t, param=spec.kind is Kind.WEIGHT_PREP or
                                            (spec.kind is Kind.MATMUL and self.rng.random() < 0.3))
        self.env.update(drawn)
        self.solve_guards()  # a guard the drawn attributes or leaves break: draw this term again
        return self.graph.add_node(spec.name, [self._id(i) for i in inputs], **attrs)

    def _sampled(self, spec: Any, named: list[tuple[str, Any]]) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
        """Shapes of the free leaves among ``named`` inputs and attribute values from the op's registry sampler,
        the sample's dims renamed to those of the inputs already built; nothing when they do not fit."""
        shapes, attrs = spec.sampler(self.rng)
        dims: dict[int, int] = {}
        free: dict[str, tuple[int, ...]] = {}
        for name, item in named:
            sample = shapes.get(name)
            if isinstance(item, str) and item not in self.env and item not in self.leaf_shape:
                if sample is not None:
                    free[item] = tuple(sample)
                continue
            actual = self.leaf_shape[item] if isinstance(item, str) and item not in self.env \
                else self.graph.node(self._id(item)).shape
            if sample is None or len(sample) != len(actual) \
                    or any(dims.setdefault(d, a) != a for d, a in zip(sample, actual, strict=True)):
                return {}, {}
        return {v: tuple(dims.get(d, d) for d in shape) for v, shape in free.items()}, attrs

    def _id(self, item: Any) -> int:
        return self.env[item] if isinstance(item, str) else item

    def _input_items(self, term: Term, variadic: bool) -> list[Any]:
        if isinstance(term, Var):
            if variadic:  # a TensorList variable: a random tail of 0 to 2 leaves
                if term.name not in self.env:
                    self.env[term.name] = [f"{term.name}[{k}]" for k in range(int(self.rng.integers(3)))]
                return list(self.env[term.name])
            return [term.name]
        if isinstance(term, Absent):
            return []
        if isinstance(term, TensorList):
            items = [x for item in term.items for x in self._input_items(item, False)]
            return items + (self._input_items(term.rest, True) if term.rest is not None else [])
        return [self.term(term)]

    def _attr(self, term: Term, attr: Any, drawn: dict[str, Any], in_types: list[TensorType]) -> Any:
        if isinstance(term, Var) and term.name not in self.env:
            if term.name not in drawn:
                drawn[term.name] = self._draw_attr(attr, in_types)
            value = drawn[term.name]
        else:
            try:
                value = self.value(term)
            except NoValue:
                raise NoInstance("{} has no value", term) from None
        return _attr_value(value, attr.type)

    def _draw_attr(self, attr: Any, in_types: list[TensorType]) -> Any:
        """A random value for ``attr`` of a node whose inputs have types ``in_types``."""
        rng, t = self.rng, attr.type
        rank = in_types[0].rank if in_types else 0
        if attr.name == "name":
            return f"v{next(self.names)}"
        if t is AttrType.DTYPE:
            return self.dtype
        if attr.choices and rng.random() < 0.7:
            return attr.choices[int(rng.integers(len(attr.choices)))]
        if t is AttrType.INT:
            dims = [d for n in self.graph.nodes for d in n.shape]
            pool = [-1, -1, -2, 0, 1, 2, *self.literals[I64], *dims]
            return int(pool[int(rng.integers(len(pool)))])
        if t is AttrType.FLOAT:
            pool = self.literals[F64]
            if pool and rng.random() < 0.5:
                return float(pool[int(rng.integers(len(pool)))])
            return float(10.0 ** rng.uniform(-3.0, 0.0)) if rng.random() < 0.5 else float(rng.uniform(0.1, 2.0))
        if t is AttrType.BOOL:
            return bool(rng.integers(2))
        if t is AttrType.INTS and attr.dims and in_types and rng.random() < 0.5:
            return self._regroup(in_types[0].shape)  # a Reshape or Expand target that keeps the elements
        if t is AttrType.INTS:
            return self._draw_perm(rank) if rng.random() < 0.5 else self._draw_shape()
        if t is AttrType.STR:
            pool = self.literals[STRING] or [attr.default]
            return pool[int(rng.integers(len(pool)))]
        raise NoInstance(f"no random value for attribute {attr.name} ({t.value})")

    def _regroup(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` with one dim split in two (a factor first, 1 included) or two neighbours merged: the same
        elements in another shape, such as a head split [B, S, H * D] -> [B, S, H, D]."""
        rng, dims = self.rng, list(shape)
        if len(dims) >= 2 and rng.random() < 0.3:
            i = int(rng.integers(len(dims) - 1))
            return (*dims[:i], dims[i] * dims[i + 1], *dims[i + 2:])
        if not dims:
            return (1,)
        i = int(rng.integers(len(dims)))
        factors = [f for f in range(1, dims[i] + 1) if dims[i] % f == 0]
        f = factors[int(rng.integers(len(factors)))]
        return (*dims[:i], f, dims[i] // f, *dims[i + 1:])

    def _draw_perm(self, rank: int) -> tuple[int, ...]:
        """A permutation of ``rank`` axes; half the time from rank 3 on one that is not its own inverse (a
        rule that takes a perm for its inverse is right on the others)."""
        perm = tuple(int(a) for a in self.rng.permutation(rank))
        if rank >= 3 and self.rng.random() < 0.5:
            while all(perm[p] == k for k, p in enumerate(perm)):
                perm = tuple(int(a) for a in self.rng.permutation(rank))
        return perm

    def _draw_shape(self) -> tuple[int, ...]:
        """A random shape: often one of (a suffix of) a shape already built, so joins and broadcasts meet."""
        rng = self.rng
        built = [n.shape for n in self.graph.nodes if n.shape]
        if built and rng.random() < 0.6:
            shape = built[int(rng.integers(len(built)))]
            return shape[int(rng.integers(len(shape))):] if rng.random() < 0.3 else shape
        return tuple(int(d) for d in rng.integers(1, 5, size=(1, 2, 2, 3, 3, 4)[int(rng.integers(6))]))

    def leaf(self, var: str, param: bool | None) -> int:
        if var not in self.env:
            t = TensorType(self.leaf_shape.get(var) or self._draw_shape(), self.leaf_dtype.get(var, self.dtype))
            self.env[var] = self._leaf_node(var, t, bool(param))
        return self.env[var]

    def _leaf_node(self, var: str, t: TensorType, param: bool) -> int:
        param = self.leaf_op[var] == "Param" if var in self.leaf_op else param
        name = f"{'w' if param else 'x'}{next(self.names)}"
        given = self.leaf_name.get(var)
        if isinstance(given, Lit):
            name = str(given.value)
        node = self.graph.param(name, t.shape, t.dtype) if param else self.graph.input(name, t.shape, t.dtype)
        if isinstance(given, Var):
            self.env.setdefault(given.name, name)
        return node


def build_instance(query: Query, rng: np.random.Generator) -> Graph:
    """A random graph on which ``query`` (a query, unfolded and prepared) can match; NoInstance when this draw
    fails."""
    return InstanceBuilder(query).build(rng)


def _tuple(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _attr_value(value: Any, kind: AttrType) -> Any:
    if kind is AttrType.INTS:
        return tuple(value)
    if kind is AttrType.FLOAT:
        return float(value)
    return value


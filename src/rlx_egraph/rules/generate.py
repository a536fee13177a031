"""Recognition rules generated from decompositions.

A fused op whose recognition rule is its decomposition read backwards declares the rule with the op
(:attr:`OpSpec.rule <rlx_egraph.ir.registry.OpSpec.rule>`, a :class:`~rlx_egraph.ir.registry.DecompositionRule`:
name, stage, rule file, guards).  :func:`decomposition_rule` runs the op's ``decompose`` on a graph that records
terms instead of nodes, its inputs and attributes standing as variables, and writes the rule's text::

    (rewrite <the decomposition> (<Op> ?<input> ... ?<attribute> ...) :ruleset <stage> :name "<name>")

(a ``rule`` with a ``union`` where it has guards).  A dtype the decomposition reads from an input becomes a variable
(``?dt`` for the first input's, ``?dt_<input>`` for another's).  A decomposition that reads a dim, compares an
attribute's value or builds a constant tensor is not a pattern: :class:`NotAPattern` says where.

The rules sit in the shipped ``.egg`` files, each under a marker line (:data:`MARKER`), so that a rule author reads
them where the other rules are; ``python -m rlx_egraph.rules.generate`` writes them there (a rule not yet in its
file is added at the end, under a comment of the op's doc), and ``--check`` exits with 1 naming the files that are
not as generated (a test runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..ir.graph import Graph
from ..ir.registry import REGISTRY, REQUIRED, AttrType, Kind, OpSpec, op_spec
from .model import RuleError
from .ruleset import default_rule_dir
from .terms import F64, Absent, Call, Lit, OpTerm, TensorList, Term, Var

MARKER = ";; generated from {op}'s decomposition (python -m rlx_egraph.rules.generate)"
ROOT = "?e"  # the matched term of a generated rule with guards
WIDTH = 110  # a rule's first line longer than this puts the op term on a line of its own


class NotAPattern(RuleError):
    """An op's decomposition reads something a rule pattern cannot hold."""


class _Unknown:
    """An attribute of the op being read backwards: it may be passed on to the ops the decomposition builds, not
    looked at."""

    def __init__(self, op: str, name: str) -> None:
        self.op, self.name = op, name

    def _refuse(self, *args: Any) -> NoReturn:
        raise NotAPattern(f"{self.op}'s decomposition computes with its attribute {self.name!r}: it is not a pattern")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = __float__ = __int__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = __neg__ = _refuse
    __hash__ = None  # type: ignore[assignment]


class _Read:
    """What a decomposition may read of a node of the recording graph: an input's dtype."""

    def __init__(self, graph: _Recorder, nid: int) -> None:
        self._graph, self._nid = graph, nid

    @property
    def dtype(self) -> Var:
        if self._nid not in self._graph.dtypes:
            raise NotAPattern(f"{self._graph.op}'s decomposition reads the dtype of a value it computed")
        return self._graph.dtypes[self._nid]

    def __getattr__(self, name: str) -> NoReturn:
        raise NotAPattern(f"{self._graph.op}'s decomposition reads the {name} of a node: it is not a pattern")


class _Recorder(Graph):
    """A graph whose builders record egglog terms (node id -> term) instead of checked nodes."""

    def __init__(self, spec: OpSpec) -> None:
        super().__init__(f"{spec.name}-pattern")
        self.op = spec.name
        self.terms: dict[int, Term] = {}
        self.dtypes: dict[int, Var] = {}

    def variable(self, term: Term, dtype: Var) -> int:
        nid = len(self.terms)
        self.terms[nid], self.dtypes[nid] = term, dtype
        return nid

    def add_node(self, op: str, inputs: Sequence[int] = (), node_id: int | None = None, **attrs: Any) -> int:
        spec = op_spec(op)
        if spec.kind is Kind.LEAF and op != "Scalar":
            raise NotAPattern(f"{self.op}'s decomposition builds a {op} leaf: it is not a pattern")
        args: list[Term] = []
        given = [self.terms[i] for i in inputs]
        for raw in spec.inputs:
            if raw.endswith("*"):
                args.append(TensorList(tuple(given)))
                given = []
            elif given:
                args.append(given.pop(0))
            elif raw.endswith("?"):
                args.append(Absent())
            else:
                raise NotAPattern(f"{self.op}'s decomposition builds {op} without its input {raw!r}")
        for a in spec.attrs:
            value = attrs.get(a.name, a.default)
            if value is REQUIRED:
                raise NotAPattern(f"{self.op}'s decomposition builds {op} without its attribute {a.name!r}")
            args.append(_attribute(value, a.type))
        nid = len(self.terms)
        self.terms[nid] = OpTerm(op, tuple(args))
        return nid

    def node(self, node_id: int) -> Any:
        return _Read(self, node_id)

    def scalar(self, value: Any, dtype: Any = "f32") -> int:
        return self.add_node("Scalar", value=value, dtype=dtype)


def _attribute(value: Any, kind: AttrType) -> Term:
    """An attribute's term: a variable of the op's, or a literal of its sort."""
    if isinstance(value, _Unknown):
        return Var(f"?{value.name}")
    if isinstance(value, Var):
        return value
    if kind is AttrType.INTS:
        return Call("vec-of", tuple(Lit(int(v), "i64") for v in value))
    sort = kind.egglog_sort
    return Lit(float(value) if sort == F64 else value, sort)


def decomposition_terms(spec: OpSpec) -> tuple[Term, Term]:
    """The decomposition of ``spec`` as a pattern, and the op's term over the same variables."""
    if spec.decompose is None:
        raise NotAPattern(f"{spec.name} has no decomposition")
    g = _Recorder(spec)
    names = [*spec.input_names, *spec.attr_names]
    if len(set(names)) != len(names) or ROOT in {f"?{n}" for n in names}:
        raise NotAPattern(f"{spec.name}: its inputs and attributes need distinct names other than {ROOT[1:]!r}")
    inputs = [g.variable(Var(f"?{name}"), Var("?dt" if k == 0 else f"?dt_{name}"))
              for k, name in enumerate(spec.input_names)]
    attrs = {a.name: _Unknown(spec.name, a.name) for a in spec.attrs}
    out = spec.decompose(g, inputs, attrs)
    if not isinstance(out, int):
        raise NotAPattern(f"{spec.name} has several results: its rule is not one rewrite")
    args = tuple(g.terms[i] for i in inputs) + tuple(Var(f"?{a.name}") for a in spec.attrs)
    return g.terms[out], OpTerm(spec.name, args)


def decomposition_rule(spec: OpSpec) -> str:
    """The egglog text of ``spec``'s generated rule (under its marker line)."""
    declared = spec.rule
    if declared is None:
        raise NotAPattern(f"{spec.name} declares no rule generated from its decomposition")
    lhs, rhs = map(str, decomposition_terms(spec))
    tail = f':ruleset {declared.stage} :name "{declared.name}")'
    if declared.guards:
        head = f"(rule ((= {ROOT} {lhs}) {' '.join(declared.guards)})"
        if len(head) > WIDTH:
            head = f"(rule ((= {ROOT} {lhs})" + "".join(f"\n       {guard}" for guard in declared.guards) + ")"
        union = f"      ((union {ROOT} {rhs}))"
        body = f"{union} {tail}" if len(f"{union} {tail}") <= WIDTH else f"{union}\n      {tail}"
    else:
        head = f"(rewrite {lhs} {rhs}" if len(f"(rewrite {lhs} {rhs}") <= WIDTH else f"(rewrite {lhs}\n         {rhs}"
        body = f"         {tail}"
    return f"{MARKER.format(op=spec.name)}\n{head}\n{body}"


def declared_rules() -> dict[str, list[OpSpec]]:
    """Rule file name -> the ops whose generated rules it holds, in registry order."""
    out: dict[str, list[OpSpec]] = {}
    for spec in REGISTRY.values():
        if spec.rule is not None:
            out.setdefault(spec.rule.file, []).append(spec)
    return out


def _rule_span(text: str, name: str) -> tuple[int, int] | None:
    """Where the rule named ``name`` is written in ``text`` (with its marker line if it has one); None if absent."""
    found = re.search(rf':name "{re.escape(name)}"', text)
    if found is None:
        return None
    start = text.rfind("\n(", 0, found.start()) + 1
    depth, k, quoted = 0, start, False
    while True:
        ch = text[k]
        if ch == '"' and text[k - 1] != "\\":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                break
        k += 1
    previous = text.rfind("\n", 0, start - 1) + 1
    if text[previous:start - 1].startswith(";; generated from "):
        start = previous
    return start, k + 1


def updated(text: str, specs: Sequence[OpSpec]) -> str:
    """``text`` (a rule file's) with the generated rules of ``specs`` written in place, or added at its end."""
    for spec in specs:
        rule = decomposition_rule(spec)
        span = _rule_span(text, spec.rule.name)  # type: ignore[union-attr]
        if span is None:
            doc = textwrap.fill(f"{spec.name}: {spec.doc.split('. ')[0].rstrip('.')}.", WIDTH, initial_indent=";; ",
                                subsequent_indent=";; ")
            text = f"{text.rstrip()}\n\n{doc}\n{rule}\n"
        else:
            text = text[:span[0]] + rule + text[span[1]:]
    return text


def stale(rule_dir: Path | None = None) -> list[str]:
    """The shipped rule files whose generated rules are not as generated."""
    folder = rule_dir or default_rule_dir()
    return [file for file, specs in declared_rules().items()
            if updated((folder / file).read_text(), specs) != (folder / file).read_text()]


def write(rule_dir: Path | None = None) -> list[str]:
    """Write the generated rules into the shipped rule files; returns the files changed."""
    folder = rule_dir or default_rule_dir()
    changed = stale(folder)
    for file in changed:
        path = folder / file
        path.write_text(updated(path.read_text(), declared_rules()[file]))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlx_egraph.rules.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is not as generated")
    parser.add_argument("--rules", type=Path, default=None, help="the rule folder (default: the shipped rules)")
    args = parser.parse_args(argv)
    if args.check:
        files = stale(args.rules)
        for file in files:
            print(f"{file}: its generated rules are stale (python -m rlx_egraph.rules.generate)", file=sys.stderr)
        return 1 if files else 0
    for file in write(args.rules):
        print(f"wrote {file}")
    return 0


__all__ = ["MARKER", "NotAPattern", "declared_rules", "decomposition_rule", "decomposition_terms", "main", "stale",
           "updated", "write"]

if __name__ == "__main__":
    sys.exit(main())

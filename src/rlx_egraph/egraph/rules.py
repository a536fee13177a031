"""Loading ``.egg`` rule files into data.

A rule file holds ``rewrite``/``birewrite``/``rule`` commands, each with a
``:ruleset`` naming one of the saturation :data:`STAGES` and a unique ``:name``,
and ``relation`` or ``function`` declarations for helper tables that rules share.
Files are parsed by egglog's own parser and type-checked against the schema
at load time, so a malformed file fails here with ``file:line``, the rule's
name and the problem (syntax, unknown constructor, wrong arity, wrong sort, a
variable the left side does not bind, a duplicate name); so does any other
command, and a rule that deletes or subsumes terms.  Files are cached by
content, so a file edited in place is read again.  :class:`RuleSet` is the
user-facing API: load, combine, disable, list.

Operands of commutative ops (``OpSpec.commutative``: Add, Mul, ...) match in
either order: each rule is loaded once per distinct operand order of the
commutative op calls in its query (a rule's body, a rewrite's left-hand side
and conditions, both sides of a birewrite), at most :data:`MAX_VARIANTS`.  The
order as written keeps the rule's name; the others are named ``<name>#2``,
``<name>#3``, ... and carry the written rule's name as :attr:`Rule.base`.

The parsed commands are kept (:attr:`Rule.command`, the variant's), so other
engines can apply the same rules.  What runs in egglog (:attr:`Rule.program`)
is the rule instrumented with provenance: its actions also add, for every op
term they construct, a row ``(built-<Op> <the constructor's arguments> "<base
rule name>")`` and, for every union, a row ``(merged-by <class> "<base rule
name>")``.  The tables are lowercase, so they are not counted as e-nodes; the
view reads them back.
"""

from __future__ import annotations

import bisect
import builtins
import difflib
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from itertools import product
from pathlib import Path
from typing import Any

from egglog import bindings as eb

from ..errors import RlxError
from ..ir.registry import REGISTRY
from .schema import FACT_TABLES, LIST_CONS, LIST_NIL, NO_INPUT, constructor_args, schema_text

# Saturation stages, run in this order; every rule belongs to one.
STAGES: tuple[str, ...] = ("simplify", "recognize", "fuse", "blocks")
STAGE_DOCS = {
    "simplify": "algebraic clean-ups (double negation, inverse transposes, x*1, ...)",
    "recognize": "export forms back to ops (x*sigmoid(x) -> Silu, erf-GELU, decomposed norms)",
    "fuse": "kernel fusions (matmul epilogues, residual norms, SwiGLU, shared-input matmuls, ...)",
    "blocks": "whole-block fusions built on fused ops (attention block, transformer layer)",
}

ALLOWED_COMMANDS = "rewrite, birewrite, rule and relation"
MERGED_BY = "merged-by"  # (merged-by class rule): ``rule`` unioned something into ``class``
_ROOT = "?rewrite-root"  # the matched term of a rewrite, once it is written as a rule
MAX_VARIANTS = 256  # operand orders one rule may be loaded in
VARIANT_MARK = "#"  # <name>#<k>: the k-th operand order of rule <name>


def built_by_table(op: str) -> str:
    """The provenance relation of ``op``: its constructor's arguments, then the rule name."""
    return f"built-{op}"


def provenance_declaration(op: str | None) -> str:
    """The egglog declaration of ``op``'s provenance relation, or of ``merged-by`` for ``None``."""
    if op is None:
        return f"(relation {MERGED_BY} (Op String))"
    sorts = " ".join(a.sort for a in constructor_args(REGISTRY[op]))
    return f"(relation {built_by_table(op)} ({sorts} String))"


class RuleError(RlxError, ValueError):
    """A rule file is malformed; the message starts with ``file:line``."""


@dataclass(frozen=True)
class Rule:
    """One parsed rule: where it is, which stage runs it, what it reads and builds.

    It is one operand order of the rule as written, named ``base``, which
    provenance and match counts use.
    """

    name: str
    base: str
    stage: str
    file: str
    line: int
    source: str
    reads: frozenset[str]
    builds: frozenset[str]
    command: Any = field(repr=False, compare=False)  # as parsed from the file
    program: tuple[Any, ...] = field(default=(), repr=False, compare=False)  # what runs: with provenance
    new_enodes: int = 0  # at most this many e-nodes per match: the constructor calls it builds

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    @cached_property
    def program_text(self) -> str:
        """The egglog text of :attr:`program` (made once: every new e-graph parses it)."""
        return "\n".join(map(str, self.program))


Source = tuple[str, str, bytes]  # a loaded rule file: (path, name shown in messages, content)


@dataclass
class RuleSet:
    """All loaded rules and helper relations, in file order.

    Build one with :meth:`shipped`, :meth:`from_files` or :meth:`from_strings`;
    combine with ``+`` / :meth:`extend` (the sources are loaded again together,
    so a name used twice is an error naming both places) and switch rules off
    with :meth:`without`.  Every operation returns a new RuleSet.
    """

    rules: list[Rule]
    files: list[Path]
    declarations: list[tuple[str, Any]] = field(default_factory=list)
    provenance: list[tuple[str, Any]] = field(default_factory=list)  # provenance relations the rules fill
    sources: tuple[Source, ...] = ()  # what was loaded, in order
    disabled: frozenset[str] = frozenset()  # names switched off by ``without``

    @classmethod
    def shipped(cls) -> RuleSet:
        """The rules shipped in ``rules/``."""
        return load_rules()

    @classmethod
    def from_files(cls, *paths: str | Path) -> RuleSet:
        """The rules of these files and folders (``*.egg`` in a folder), and only these."""
        return load_rules(paths)

    @classmethod
    def from_strings(cls, *texts: str, names: Sequence[str] | None = None) -> RuleSet:
        """Rules from egglog source text; ``names`` are shown in messages (default ``<string 1>``, ...)."""
        shown = list(names) if names is not None else [f"<string {k}>" for k in range(1, len(texts) + 1)]
        if len(shown) != len(texts):
            raise ValueError(f"from_strings got {len(texts)} texts but {len(shown)} names")
        return _load(tuple((name, name, text.encode()) for name, text in zip(shown, texts, strict=True)))

    def __add__(self, other: RuleSet) -> RuleSet:
        if not isinstance(other, RuleSet):
            return NotImplemented
        return _load(self.sources + other.sources).without(self.disabled | other.disabled)

    def extend(self, *others: RuleSet | str | Path) -> RuleSet:
        """This set followed by other sets, rule files or folders (a new RuleSet)."""
        out = self
        for other in others:
            out = out + (other if isinstance(other, RuleSet) else RuleSet.from_files(other))
        return out

    def without(self, names: str | Iterable[str]) -> RuleSet:
        """This set minus the rules named (with all their operand orders); an unknown name is a RuleError
        listing close names."""
        drop = frozenset([names] if isinstance(names, str) else names)
        known = list(dict.fromkeys(r.base for r in self.rules))
        for name in sorted(drop - set(known) - self.disabled):
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            raise RuleError(f"no rule named {name!r} to disable"
                            + (f"; close names: {', '.join(close)}" if close else f" ({len(known)} rules loaded)"))
        if not drop - self.disabled:
            return self
        return replace(self, rules=[r for r in self.rules if r.base not in drop], disabled=self.disabled | drop)

    @property
    def text(self) -> str:
        """The egglog text of what runs: rulesets, provenance and helper relations, every instrumented rule."""
        decls = [f"(ruleset {s})" for s in STAGES] + [source for source, _ in self.provenance + self.declarations]
        rules = [f";; {r.name} ({r.location})\n{r.program_text}" for r in self.rules]
        return "\n".join(decls + rules) + "\n"

    def commands(self) -> list[Any]:
        """Parsed egglog commands: provenance and helper relations first, then the instrumented rules."""
        return [c for _, c in self.provenance + self.declarations] + [c for r in self.rules for c in r.program]

    def by_name(self, name: str) -> Rule:
        """The rule called ``name``: a rule as written (its first loaded operand order) or one order."""
        for r in self.rules:
            if name in (r.name, r.base):
                return r
        raise KeyError(f"no rule named {name!r}")

    def producers(self, op: str) -> list[Rule]:
        """Rules whose actions build constructor ``op``."""
        return [r for r in self.rules if op in r.builds]

    def schedule_text(self, iterations: int = 20) -> str:
        """A plain staged schedule (used by ``dump_egglog_program``)."""
        runs = " ".join(f"(repeat {iterations} (run {s}))" for s in STAGES)
        return f"(run-schedule {runs})\n"

    def list(self) -> builtins.list[dict[str, Any]]:
        """One JSON-ready record per rule as written, in file order: name, stage, file, line, location, reads,
        builds, and how many operand orders the loader generated from it."""
        orders = Counter(r.base for r in self.rules)
        return [{"name": r.name, "stage": r.stage, "file": r.file, "line": r.line, "location": r.location,
                 "reads": sorted(r.reads), "builds": sorted(r.builds), "operand_orders": orders[r.base]}
                for r in self.rules if r.name == r.base]


# The folder the wheel ships the rule files in, inside the package (pyproject's force-include); not ``rules``,
# which is the module ``rlx_egraph.rules``.
SHIPPED_RULES_DIR = "shipped_rules"


def default_rule_dir() -> Path:
    """The shipped ``rules/`` folder: inside the installed package, or the repo's."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / SHIPPED_RULES_DIR
    return packaged if packaged.is_dir() else here.parent.parent / "rules"


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.glob("*.egg")))
        elif p.is_file():
            out.append(p)
        else:
            raise RuleError(f"{p}: no such rule file or folder")
    return out


def load_rules(rules: RuleSet | str | Path | Iterable[str | Path] | None = None) -> RuleSet:
    """Load the shipped rules (``None``), or a rule file, a folder, or a list of them.

    Extra user files are usually loaded together with the shipped ones:
    ``load_rules([default_rule_dir(), "my_rules.egg"])``.  Files are read on
    every call; parsing is cached by their content.
    """
    if isinstance(rules, RuleSet):
        return rules
    paths = [default_rule_dir()] if rules is None else [rules] if isinstance(rules, str | Path) else list(rules)
    return _load(tuple((str(p), _display_path(p), p.read_bytes()) for p in rule_files(paths)))


@lru_cache(maxsize=16)
def _load(files: tuple[tuple[str, str, bytes], ...]) -> RuleSet:
    """Parse and type-check ``(path, display name, content)`` files, in order."""
    checker, runner = _egraph(), _egraph()  # the rules as written / as instrumented
    rules: list[Rule] = []
    declarations: list[tuple[str, Any]] = []
    built: set[str] = set()
    seen: dict[str, Rule] = {}
    for _, display, data in files:
        text = _decode(display, data)
        try:
            commands = checker.parse_program(text, filename=display)
        except eb.EggSmolError as exc:
            raise RuleError(_egglog_error(display, exc)) from None
        for k, command in enumerate(commands):
            kind = type(command).__name__
            if kind in ("Relation", "FunctionCommand"):
                _run(checker, command, display, _line_of(text, command.span.i))
                runner.run_program(command)
                declarations.append((text[command.span.i:command.span.j], command))
                continue
            if kind not in ("RewriteCommand", "BiRewriteCommand", "RuleCommand"):
                start = _command_starts(commands, text)[k]
                keyword = re.match(r"\(\s*([^\s()]+)", text[start:])
                raise RuleError(f"{display}:{_line_of(text, start)}: '{keyword.group(1) if keyword else kind}' "
                                f"does not belong in a rule file, which holds only {ALLOWED_COMMANDS} commands; "
                                f"the optimizer declares and runs the stages {', '.join(STAGES)}")
            rule = _rule_from_command(command, display, text)
            if rule.name in seen:
                raise RuleError(f"{rule.location}: rule name {rule.name!r} is already used at "
                                f"{seen[rule.name].location}")
            seen[rule.name] = rule
            _run(checker, command, display, rule.line)  # type-checks against the schema
            built |= rule.builds & REGISTRY.keys()
            for variant in _operand_orders(rule):
                try:
                    runner.run_program(*variant.program)
                except eb.EggSmolError as exc:
                    raise RuleError(f"{rule.location}: rule {rule.name!r} cannot record provenance (only unions "
                                    f"of Op terms can be recorded): {_egglog_detail(exc)[1]}") from None
                rules.append(variant)
    provenance = [provenance_declaration(op) for op in [None, *(op for op in REGISTRY if op in built)]]
    return RuleSet(rules, [Path(p) for p, _, _ in files], declarations,
                   [(text, runner.parse_program(text)[0]) for text in provenance], files)


def egglog_rule_bases(rules: RuleSet) -> dict[str, str]:
    """The base rule name of every rule egglog runs, by egglog's name for it (operand orders, rewrite directions)."""
    return {command.rule.name: r.base for r in rules.rules for command in r.program}


def _egraph() -> eb.EGraph:
    """An e-graph with the schema, the stages and every provenance relation declared."""
    egraph = eb.EGraph()
    decls = [f"(ruleset {s})" for s in STAGES] + [provenance_declaration(op) for op in [None, *REGISTRY]]
    egraph.run_program(*egraph.parse_program(schema_text() + "\n".join(decls)))
    return egraph


def _run(egraph: eb.EGraph, command: Any, file: str, line: int) -> None:
    """Run (type-check) one command; an egglog error becomes ``file:line: rule 'name': problem``."""
    try:
        egraph.run_program(command)
    except eb.EggSmolError as exc:
        error_line, detail = _egglog_detail(exc)
        name = _command_name(command)
        raise RuleError(f"{file}:{error_line or line}: {f'rule {name!r}: ' if name else ''}"
                        f"{_explain(detail, type(command).__name__ == 'RuleCommand')}") from None


def _command_name(command: Any) -> str | None:
    """The ``:name`` of a rule or rewrite command (None for a declaration)."""
    part = getattr(command, "rule", None) or getattr(command, "rewrite", None)
    return getattr(part, "name", None) or None


def _explain(detail: str, is_rule: bool) -> str:
    """egglog's type-check message in the words of a rule file: which problem, and what was expected."""
    if m := re.fullmatch(r"Unbound function (\S+)", detail):
        known = [NO_INPUT, LIST_NIL, LIST_CONS, *REGISTRY, *FACT_TABLES]
        close = difflib.get_close_matches(m.group(1), known, n=1)
        return f"unknown constructor {m.group(1)!r}" + (f"; did you mean {close[0]!r}?" if close else "")
    if m := re.fullmatch(r"Arity mismatch, expected (\d+) args: \((\S+)(.*)\)", detail, re.S):
        op, given = m.group(2), len(m.group(3).split())  # egglog shows the call with its arguments as written
        args = f" ({', '.join(a.name for a in constructor_args(REGISTRY[op]))})" if op in REGISTRY else ""
        takes = f"{m.group(1)} argument{'' if m.group(1) == '1' else 's'}"
        return f"wrong arity: {op} takes {takes}{args}, got {given} in {detail.partition(': ')[2]}"
    if m := re.fullmatch(r"Expect expression (.+) to have type (\S+), but get type (\S+)", detail, re.S):
        return f"wrong type: {m.group(1)} has sort {m.group(3)} where sort {m.group(2)} is expected"
    if m := re.fullmatch(r"Unbound symbol (\S+)", detail):
        side = "its query" if is_rule else "the left side"
        return f"variable {m.group(1)} is used but {side} does not bind it"
    return detail


def _decode(file: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise RuleError(f"{file}:{line}: not UTF-8 text ({exc.reason} 0x{data[exc.start]:02x} at byte {exc.start}, "
                        f"column {column}); rule files must be UTF-8") from None


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _egglog_error(file: str, exc: Exception, fallback_line: int | None = None) -> str:
    """``file:line: message`` from egglog's ``In L:C-C of file: ...`` errors."""
    line, detail = _egglog_detail(exc)
    return f"{file}:{line or fallback_line or 1}: {detail}"


def _egglog_detail(exc: Exception) -> tuple[int | None, str]:
    """The line (when egglog names one) and the message of an egglog error."""
    text = str(exc)
    m = re.search(r"In (\d+):\d+(?:-\d+(?::\d+)?)? of [^:]+:(.*)", text, re.S)
    if not m:
        return None, text.strip()
    lines = [line.strip() for line in m.group(2).splitlines() if line.strip()]
    return int(m.group(1)), lines[-1] if len(lines) > 1 else (lines[0] if lines else text.strip())


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _command_starts(commands: list[Any], text: str) -> list[int]:
    """The offset of the top-level form each command was parsed from.

    A command's form is the one around its (possibly nested) span; a command
    without a span (``push``) comes from the form after the previous command's.
    """
    forms = _form_starts(text)
    out: list[int] = []
    k = -1
    for command in commands:
        span = _span_of(command)
        k = bisect.bisect_right(forms, span.i) - 1 if span is not None else min(k + 1, len(forms) - 1)
        out.append(forms[k])
    return out


def _form_starts(text: str) -> list[int]:
    """Offsets of the top-level parenthesised forms of egglog source (comments and strings skipped)."""
    starts: list[int] = []
    depth, i = 0, 0
    while i < len(text):
        ch = text[i]
        if ch == ";":
            i = text.find("\n", i)
            if i < 0:
                break
        elif ch == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            if depth == 0:
                starts.append(i)
            depth += 1
        elif ch == ")":
            depth -= 1
        i += 1
    return starts


def _span_of(node: Any) -> Any:
    """The first source span in a parsed command (its own, or a nested part's)."""
    span = getattr(node, "span", None)
    if isinstance(span, eb.EgglogSpan):
        return span
    for part in ("rule", "rewrite", "action", "schedule", "command"):
        if hasattr(node, part):
            return _span_of(getattr(node, part))
    return None


def _rule_from_command(command: Any, file: str, text: str) -> Rule:
    kind = type(command).__name__
    if kind in ("RewriteCommand", "BiRewriteCommand"):
        rw = command.rewrite
        stage, name, span = command.name, rw.name, rw.span
        reads = _constructors([rw.lhs, *rw.conditions])
        builds = _constructors([rw.rhs]) | (reads if kind == "BiRewriteCommand" else frozenset())
        new_enodes = len(_constructor_calls([rw.rhs]))
        if kind == "BiRewriteCommand":
            new_enodes = max(new_enodes, len(_constructor_calls([rw.lhs])))
    else:
        r = command.rule
        stage, name, span = r.ruleset, r.name, r.span
        reads, builds = _constructors(r.body), _constructors(r.head)
        new_enodes = len(_constructor_calls(r.head))
    line = _line_of(text, span.i)
    if stage not in STAGES:
        raise RuleError(f"{file}:{line}: rule {name or '(unnamed)'} needs ':ruleset' set to one of "
                        f"{', '.join(STAGES)} (got {stage or 'none'!r})")
    if not name or name.startswith("("):
        raise RuleError(f"{file}:{line}: every rule needs a ':name \"...\"'")
    if VARIANT_MARK in name:
        raise RuleError(f"{file}:{line}: rule name {name!r} contains {VARIANT_MARK!r}, which names the operand-order "
                        f"variants the loader generates ({name.split(VARIANT_MARK)[0]}{VARIANT_MARK}2, ...)")
    _refuse_removals(command, kind, name, file, text, line)
    return Rule(name, name, stage, file, line, text[span.i:span.j], reads, builds, command,  # program: per order
                new_enodes=new_enodes)


def _operand_orders(rule: Rule) -> list[Rule]:
    """``rule`` once per distinct operand order of the commutative op calls in its query, as written first."""
    command, kind = rule.command, type(rule.command).__name__
    try:
        if kind == "RuleCommand":
            r = command.rule
            commands = [eb.RuleCommand(eb.Rule(r.span, r.head, body, _variant_name(rule.base, k), r.ruleset,
                                               r.eval_mode, r.no_decomp, r.include_subsumed))
                        for k, body in enumerate(_orders(r.body))]
        else:
            rw, both = command.rewrite, kind == "BiRewriteCommand"  # a birewrite's rhs is a query too
            sides = [rw.lhs, rw.rhs] if both else [rw.lhs]
            commands = []
            for k, query in enumerate(_orders([*sides, *rw.conditions])):
                rewrite = eb.Rewrite(rw.span, query[0], query[1] if both else rw.rhs, query[len(sides):],
                                     _variant_name(rule.base, k))
                commands.append(eb.BiRewriteCommand(command.name, rewrite) if both
                                else eb.RewriteCommand(command.name, rewrite, command.subsume))
    except _TooManyOrders:
        ops = ", ".join(sorted(op for op in rule.reads if op in REGISTRY and REGISTRY[op].commutative))
        raise RuleError(f"{rule.location}: rule {rule.base!r} matches in more than {MAX_VARIANTS} operand orders "
                        f"of its commutative ops ({ops}); split it into smaller rules joined by a helper "
                        f"relation") from None
    return [replace(rule, name=_variant_name(rule.base, k), command=c, program=tuple(_instrumented(c, kind, rule.base)))
            for k, c in enumerate(commands)]


def _variant_name(base: str, k: int) -> str:
    """The name of the ``k``-th (from 0) operand order of rule ``base``: the first keeps the base name."""
    return base if k == 0 else f"{base}{VARIANT_MARK}{k + 1}"


class _TooManyOrders(Exception):
    """A query has more than :data:`MAX_VARIANTS` operand orders."""


def _orders(node: Any) -> list[Any]:
    """Parsed egglog syntax (an expression, a fact or a list of them) in every operand order of its commutative op
    calls: as written first, each distinct variant once."""
    kind = type(node).__name__
    if isinstance(node, list):
        return [list(parts) for parts in _product([_orders(part) for part in node])]
    if kind == "Call":
        arg_orders = _product([_orders(arg) for arg in node.args])
        out = [eb.Call(node.span, node.name, list(args)) for args in arg_orders]
        if node.name in REGISTRY and REGISTRY[node.name].commutative:
            out += [eb.Call(node.span, node.name, list(args[::-1])) for args in arg_orders]
        return _distinct(out)
    if kind == "Eq":
        return [eb.Eq(node.span, left, right) for left, right in _product([_orders(node.left), _orders(node.right)])]
    if kind == "Fact":
        return [eb.Fact(expr) for expr in _orders(node.expr)]
    return [node]


def _product(choices: list[list[Any]]) -> list[tuple[Any, ...]]:
    """Every combination of one item per list; too many is refused before any is built.

    Combinations of distinct items are distinct, so a query with a part of
    more than :data:`MAX_VARIANTS` orders has more than that many itself.
    """
    if math.prod(map(len, choices)) > MAX_VARIANTS:
        raise _TooManyOrders
    return list(product(*choices))


def _distinct(variants: list[Any]) -> list[Any]:
    """``variants`` without repeats (same egglog text), in order; more than :data:`MAX_VARIANTS` is refused."""
    seen: dict[str, Any] = {}
    for variant in variants:
        seen.setdefault(str(variant), variant)
    out = list(seen.values())
    if len(out) > MAX_VARIANTS:
        raise _TooManyOrders
    return out


def _refuse_removals(command: Any, kind: str, name: str, file: str, text: str, line: int) -> None:
    """Rules only add to the e-graph: ``delete``, ``subsume`` and ``:subsume`` are refused."""
    allowed = ("rules may only add terms and facts (union, let, set, relation facts); the extractor already "
               "picks the cheapest term of each e-class")
    if kind == "RewriteCommand" and command.subsume:
        raise RuleError(f"{file}:{line}: rule {name!r}: ':subsume' is not supported: {allowed}")
    if kind == "RuleCommand":
        for action in command.rule.head:
            if type(action).__name__ == "Change":
                verb = type(action.change).__name__.lower()
                raise RuleError(f"{file}:{_line_of(text, action.span.i)}: rule {name!r}: '{verb}' is not "
                                f"supported: {allowed}")


def _instrumented(command: Any, kind: str, base: str) -> list[Any]:
    """The egglog commands that run ``command`` and record its provenance under ``base`` (rewrites become rules)."""
    if kind == "RuleCommand":
        r = command.rule
        return [eb.RuleCommand(eb.Rule(r.span, [*r.head, *_provenance(r.head, base)], r.body, r.name, r.ruleset,
                                       r.eval_mode, r.no_decomp, r.include_subsumed))]
    rw = command.rewrite
    name = rw.name
    directions = [(rw.lhs, rw.rhs, name)]
    if kind == "BiRewriteCommand":  # egglog's names for the two directions
        directions = [(rw.lhs, rw.rhs, f"{name}=>"), (rw.rhs, rw.lhs, f"{name}<=")]
    out = []
    for lhs, rhs, egglog_name in directions:
        root = eb.Var(rw.span, _ROOT)
        head = [eb.Union(rw.span, root, rhs)]
        body = [eb.Eq(rw.span, root, lhs), *rw.conditions]
        out.append(eb.RuleCommand(eb.Rule(rw.span, [*head, *_provenance(head, base)], body, egglog_name,
                                          command.name)))
    return out


def _provenance(head: list[Any], name: str) -> list[Any]:
    """Actions recording that rule ``name`` built each op term of ``head`` and merged each union."""
    actions: dict[str, Any] = {}
    for call in _op_calls(head):
        fact = eb.Call(call.span, built_by_table(call.name), [*call.args, eb.Lit(call.span, eb.String(name))])
        actions.setdefault(str(fact), eb.Expr_(call.span, fact))
    for action in head:
        if type(action).__name__ == "Union":
            fact = eb.Call(action.span, MERGED_BY, [action.lhs, eb.Lit(action.span, eb.String(name))])
            actions.setdefault(str(fact), eb.Expr_(action.span, fact))
    return list(actions.values())


def _op_calls(actions: list[Any]) -> Iterator[Any]:
    """Every application of a registered op in ``actions``, inner ones first."""
    stack: list[Any] = []
    for action in actions:
        kind = type(action).__name__
        if kind == "Union":
            stack += [action.lhs, action.rhs]
        elif kind == "Let":
            stack.append(action.rhs)
        elif kind == "Set":
            stack += [*action.args, action.rhs]
        elif kind == "Expr_":
            stack.append(action.expr)
    yield from _calls_post_order(stack)


def _calls_post_order(exprs: list[Any]) -> Iterator[Any]:
    for expr in exprs:
        if type(expr).__name__ == "Call":
            yield from _calls_post_order(expr.args)
            if expr.name in REGISTRY:
                yield expr


def _constructors(nodes: Iterable[Any]) -> frozenset[str]:
    """Capitalised function names (Op constructors) used anywhere in parsed egglog syntax."""
    return frozenset(_constructor_calls(nodes))


def _constructor_calls(nodes: Iterable[Any]) -> list[str]:
    """The name of every call of a capitalised function (an Op constructor) in parsed egglog syntax."""
    found: list[str] = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, list | tuple):
            stack.extend(node)
            continue
        kind = type(node).__name__
        if kind == "Call":
            if node.name[:1].isupper():
                found.append(node.name)
            stack.extend(node.args)
        elif kind not in ("Var", "Lit", "str", "int", "float", "bool", "NoneType"):
            stack.extend(getattr(node, a) for a in ("expr", "args", "lhs", "rhs", "left", "right")
                         if hasattr(node, a))
    return found

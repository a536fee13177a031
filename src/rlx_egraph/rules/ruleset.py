"""RuleSet: rule files loaded into the model, combined, switched off, listed.

A rule file holds ``rewrite``/``birewrite``/``rule`` commands, each with a
``:ruleset`` naming one of the saturation :data:`STAGES` and a unique ``:name``,
and ``relation`` or ``function`` declarations for helper tables that rules
share.  Loading parses each file once (:func:`.parse.parse_file`, cached by
content, so a file edited in place is read again), declares every helper
table of the set before any rule, type-checks each rule against the schema
(:mod:`.typecheck`) and generates its operand orders (:mod:`.variants`).  A
malformed file fails with ``file:line``, the rule's name and the problem.

Where rules from outside the shipped files add rows to helper relations, the
rows of those relations (and of the relations written from them) carry
provenance (which rules wrote each row, :mod:`.emit`), so a wrong value a
shipped rule builds on a wrong row a user rule added names the user rule; other
sets run without it.

A file's rules resolve against the declarations of every file loaded with it,
in any order, and against the shipped files' helper relations: a user file
that reads ``ln-normed`` or ``attn-scores`` loads on its own (the shipped
declarations it reads are *borrowed*: declared, and filled only if the shipped
rules that fill them are in the set) and joins the shipped rules with ``+``.
"""

from __future__ import annotations

import builtins
import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..ir.registry import REGISTRY
from .emit import HELPER_PROVENANCE, program_text, provenance_declaration, rule_text, wrote_declaration
from .model import STAGES, Declaration, Rule, RuleError, action_terms, atom_terms, tables_of
from .parse import ParsedFile, Reader, parse_file
from .primitives import PRIMITIVES
from .tables import FACT_TABLES
from .typecheck import Checker
from .variants import operand_orders

Source = tuple[str, str, bytes]  # a loaded rule file: (path, name shown in messages, content)


@dataclass
class RuleSet:
    """All loaded rules and helper tables, in file order.

    Build one with :meth:`shipped`, :meth:`from_files` or :meth:`from_strings`;
    combine with ``+`` / :meth:`extend` (the sources are loaded again together,
    so a name used twice is an error naming both places) and switch rules off
    with :meth:`without`.  Every operation returns a new RuleSet.

    ``rules`` holds every operand order (:class:`Rule`); ``helpers`` the helper
    tables (:class:`Declaration`, borrowed ones last).  ``declarations`` and
    ``provenance`` are egglog's parsed declarations (with their text) of the
    helper tables and of the provenance relations the rules fill.
    """

    rules: list[Rule]
    files: list[Path]
    declarations: list[tuple[str, Any]] = field(default_factory=list)
    provenance: list[tuple[str, Any]] = field(default_factory=list)
    sources: tuple[Source, ...] = ()  # what was loaded, in order
    disabled: frozenset[str] = frozenset()  # names switched off by ``without``
    helpers: tuple[Declaration, ...] = ()
    tracked: frozenset[str] = frozenset()  # the helper relations whose rows carry provenance (see _tracked)

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
        """This set followed by other sets, rule files or folders, loaded together (a new RuleSet)."""
        sources, disabled = self.sources, self.disabled
        for other in others:
            if isinstance(other, RuleSet):
                sources, disabled = sources + other.sources, disabled | other.disabled
            else:
                sources += _file_sources([other])
        return _load(sources).without(disabled)

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
    def written(self) -> builtins.list[Rule]:
        """The rules as written (each one's first operand order), in file order."""
        return [r for r in self.rules if r.order == 1]

    @property
    def text(self) -> str:
        """The egglog text of what runs: rulesets, provenance and helper relations, every instrumented rule."""
        decls = [f"(ruleset {s})" for s in STAGES] + [source for source, _ in self.provenance + self.declarations]
        rules = [f";; {r.name} ({r.location})\n{r.program_text}" for r in self.rules]
        return "\n".join(decls + rules) + "\n"

    def commands(self) -> builtins.list[Any]:
        """Parsed egglog commands: provenance and helper relations first, then the instrumented rules."""
        return [c for _, c in self.provenance + self.declarations] + [c for r in self.rules for c in r.program]

    def outside_shipped(self) -> builtins.list[str]:
        """The rule files (as messages name them) whose text is not that of a shipped rule file."""
        shipped = shipped_contents()
        return list(dict.fromkeys(display for _, display, data in self.sources if data not in shipped))

    def by_name(self, name: str) -> Rule:
        """The rule called ``name``: a rule as written (its first loaded operand order) or one order."""
        for r in self.rules:
            if name in (r.name, r.base):
                return r
        raise KeyError(f"no rule named {name!r}")

    def producers(self, op: str) -> builtins.list[Rule]:
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
# which is the package ``rlx_egraph.rules``.
SHIPPED_RULES_DIR = "shipped_rules"


def default_rule_dir() -> Path:
    """The shipped ``rules/`` folder: inside the installed package, or the repo's."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / SHIPPED_RULES_DIR
    return packaged if packaged.is_dir() else here.parent.parent / "rules"


def rule_files(paths: Iterable[str | Path]) -> builtins.list[Path]:
    out: builtins.list[Path] = []
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
    return _load(_file_sources(paths))


def _file_sources(paths: Iterable[str | Path]) -> tuple[Source, ...]:
    return tuple((str(p), _display_path(p), p.read_bytes()) for p in rule_files(paths))


def _parsed(source: Source) -> ParsedFile:
    _, display, data = source
    return parse_file(display, _decode(display, data))


@lru_cache(maxsize=16)
def _load(files: tuple[Source, ...]) -> RuleSet:
    """Parse and type-check ``(path, display name, content)`` files, in order."""
    parsed = [_parsed(f) for f in files]
    declared: dict[str, Declaration] = {}
    declarations: list[tuple[Declaration, Any]] = []
    for decl, command in (d for p in parsed for d in p.declarations):
        if decl.name in declared:
            raise RuleError(f"{decl.location}: {decl.name!r} is already declared at {declared[decl.name].location}")
        declared[decl.name] = decl
        declarations.append((decl, command))
    needed = {t for p in parsed for r in p.rules for t in _tables(r)} - declared.keys() - FACT_TABLES.keys()
    if needed:
        declarations += [(d, c) for d, c in _shipped_declarations() if d.name in needed]
    checker, reader = Checker(), Reader()
    for decl, command in declarations:
        checker.declare(decl, command)
    known = declared.keys() | FACT_TABLES.keys() | {d.name for d, _ in declarations}
    relations = _tracked(parsed, files, {d.name for d, _ in declarations if d.output is None})
    rules: list[Rule] = []
    built: set[str] = set()
    seen: dict[str, Rule] = {}
    for rule in (r for p in parsed for r in p.rules):
        if rule.name in seen:
            raise RuleError(f"{rule.location}: rule name {rule.name!r} is already used at {seen[rule.name].location}")
        seen[rule.name] = rule
        checker.check(rule)
        for name in sorted(_tables(rule) - known):
            raise RuleError(f"{rule.location}: rule {rule.name!r}: egglog's primitive {name!r} is not one the "
                            f"optimizer defines (every engine evaluates primitives the same way); rules may call "
                            f"{', '.join(PRIMITIVES)}")
        built |= rule.builds & REGISTRY.keys()
        for order in operand_orders(rule):
            text = program_text(order, relations)
            command = rule.command if order.order == 1 else reader.read(rule_text(order))[0]
            order = replace(order, command=command, program=tuple(reader.read(text)), program_text=text)
            checker.check_program(order)
            rules.append(order)
    provenance = [provenance_declaration(op) for op in [None, *(op for op in REGISTRY if op in built)]]
    if relations:
        provenance += [*HELPER_PROVENANCE.splitlines(), *(wrote_declaration(d.name, d.inputs) for d, _ in declarations
                                                          if d.name in relations)]
    return RuleSet(rules, [Path(p) for p, _, _ in files], [(d.source, c) for d, c in declarations],
                   [(text, reader.read(text)[0]) for text in provenance], files,
                   helpers=tuple(d for d, _ in declarations), tracked=relations)


def _tracked(parsed: list[ParsedFile], files: tuple[Source, ...], relations: set[str]) -> frozenset[str]:
    """The helper relations whose rows carry provenance (see .emit): those a rule from outside the shipped files
    writes, and those written by rules that read a tracked one (their rows may rest on a wrong row)."""
    shipped = shipped_contents()
    tracked = {t for p, (_, _, data) in zip(parsed, files, strict=True) if data not in shipped
               for r in p.rules for t in r.tables_written & relations}
    rules = [r for p in parsed for r in p.rules]
    grown = bool(tracked)
    while grown:
        more = {t for r in rules if r.tables_read & tracked for t in r.tables_written & relations} - tracked
        tracked |= more
        grown = bool(more)
    return frozenset(tracked)


def shipped_contents() -> frozenset[bytes]:
    """The text of every shipped rule file (a file of the same text elsewhere is shipped too)."""
    return frozenset(path.read_bytes() for path in default_rule_dir().rglob("*.egg"))


def _tables(rule: Rule) -> set[str]:
    """Every table a rule reads or writes."""
    terms = [t for atom in rule.query for t in atom_terms(atom)] + [t for a in rule.actions for t in action_terms(a)]
    return set(tables_of(tuple(terms))) | rule.tables_written


def _shipped_declarations() -> list[tuple[Declaration, Any]]:
    """The helper tables the shipped rule files declare (every folder of them), marked borrowed."""
    paths = sorted(default_rule_dir().rglob("*.egg"))
    return [(replace(d, borrowed=True), c) for p in paths for d, c in _parsed((str(p), _display_path(p),
                                                                                p.read_bytes())).declarations]


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

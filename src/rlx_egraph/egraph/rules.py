"""Loading ``.egg`` rule files into data.

A rule file holds ``rewrite``/``birewrite``/``rule`` commands, each with a
``:ruleset`` naming one of the saturation :data:`STAGES` and a unique ``:name``,
and ``relation`` or ``function`` declarations for helper tables that rules share.
Files are parsed by egglog's own parser and type-checked against the schema
at load time, so a malformed file fails here with ``file:line``.  The parsed
commands are kept (:class:`Rule`), so other engines can apply the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from egglog import bindings as eb

from .schema import schema_text

# Saturation stages, run in this order; every rule belongs to one.
STAGES: tuple[str, ...] = ("simplify", "recognize", "fuse", "blocks")
STAGE_DOCS = {
    "simplify": "algebraic clean-ups (double negation, inverse transposes, x*1, ...)",
    "recognize": "export forms back to ops (x*sigmoid(x) -> Silu, erf-GELU, decomposed norms)",
    "fuse": "kernel fusions (matmul epilogues, residual norms, SwiGLU, shared-input matmuls, ...)",
    "blocks": "whole-block fusions built on fused ops (attention block, transformer layer)",
}


class RuleError(ValueError):
    """A rule file is malformed; the message starts with ``file:line``."""


@dataclass(frozen=True)
class Rule:
    """One parsed rule: where it is, which stage runs it, what it reads and builds."""

    name: str
    stage: str
    file: str
    line: int
    source: str
    reads: frozenset[str]
    builds: frozenset[str]
    command: Any = field(repr=False, compare=False)

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class RuleSet:
    """All loaded rules and helper relations, in file order."""

    rules: list[Rule]
    files: list[Path]
    declarations: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Rule declarations as egglog text (rulesets, helper relations, then every rule)."""
        decls = [f"(ruleset {s})" for s in STAGES] + [source for source, _ in self.declarations]
        return "\n".join(decls + [r.source for r in self.rules]) + "\n"

    def commands(self) -> list[Any]:
        """Parsed egglog commands: helper relations first, then the rules."""
        return [command for _, command in self.declarations] + [r.command for r in self.rules]

    def by_name(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"no rule named {name!r}")

    def producers(self, op: str) -> list[Rule]:
        """Rules whose actions build constructor ``op``."""
        return [r for r in self.rules if op in r.builds]

    def schedule_text(self, iterations: int = 20) -> str:
        """A plain staged schedule (used by ``dump_egglog_program``)."""
        runs = " ".join(f"(repeat {iterations} (run {s}))" for s in STAGES)
        return f"(run-schedule {runs})\n"


def default_rule_dir() -> Path:
    """The shipped ``rules/`` folder: inside the installed package, or the repo's."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "rules"
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
    ``load_rules([default_rule_dir(), "my_rules.egg"])``.
    """
    if isinstance(rules, RuleSet):
        return rules
    if rules is None:
        return _load_default()
    paths = [rules] if isinstance(rules, str | Path) else list(rules)
    return _load(tuple(str(p) for p in rule_files(paths)))


@cache
def _load_default() -> RuleSet:
    return _load(tuple(str(p) for p in rule_files([default_rule_dir()])))


@cache
def _load(paths: tuple[str, ...]) -> RuleSet:
    egraph = eb.EGraph()
    egraph.run_program(*egraph.parse_program(schema_text() + "\n".join(f"(ruleset {s})" for s in STAGES)))
    rules: list[Rule] = []
    declarations: list[tuple[str, Any]] = []
    seen: dict[str, Rule] = {}
    for path in paths:
        text = Path(path).read_text()
        display = _display_path(Path(path))
        try:
            commands = egraph.parse_program(text, filename=display)
        except eb.EggSmolError as exc:
            raise RuleError(_egglog_error(display, exc)) from None
        for command in commands:
            if type(command).__name__ in ("Relation", "FunctionCommand"):  # helper tables
                try:
                    egraph.run_program(command)
                except eb.EggSmolError as exc:
                    raise RuleError(_egglog_error(display, exc, _line_of(text, command.span.i))) from None
                declarations.append((text[command.span.i:command.span.j], command))
                continue
            rule = _rule_from_command(command, display, text)
            if rule.name in seen:
                raise RuleError(f"{rule.location}: rule name {rule.name!r} is already used at "
                                f"{seen[rule.name].location}")
            seen[rule.name] = rule
            try:
                egraph.run_program(command)  # type-checks against the schema
            except eb.EggSmolError as exc:
                raise RuleError(_egglog_error(display, exc, rule.line)) from None
            rules.append(rule)
    return RuleSet(rules, [Path(p) for p in paths], declarations)


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _egglog_error(file: str, exc: Exception, fallback_line: int | None = None) -> str:
    """``file:line: message`` from egglog's ``In L:C-C of file: ...`` errors."""
    text = str(exc)
    m = re.search(r"In (\d+):\d+(?:-\d+(?::\d+)?)? of [^:]+:(.*)", text, re.S)
    if m:
        lines = [line.strip() for line in m.group(2).splitlines() if line.strip()]
        detail = lines[-1] if len(lines) > 1 else (lines[0] if lines else text.strip())
        return f"{file}:{m.group(1)}: {detail}"
    return f"{file}:{fallback_line or 1}: {text.strip()}"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _rule_from_command(command: Any, file: str, text: str) -> Rule:
    kind = type(command).__name__
    if kind in ("RewriteCommand", "BiRewriteCommand"):
        rw = command.rewrite
        stage, name, span = command.name, rw.name, rw.span
        reads = _constructors([rw.lhs, *rw.conditions])
        builds = _constructors([rw.rhs]) | (reads if kind == "BiRewriteCommand" else frozenset())
    elif kind == "RuleCommand":
        r = command.rule
        stage, name, span = r.ruleset, r.name, r.span
        reads, builds = _constructors(r.body), _constructors(r.head)
    else:
        span = getattr(command, "span", None)
        line = _line_of(text, span.i) if span is not None else 1
        raise RuleError(f"{file}:{line}: only rewrite, birewrite, rule and relation commands (and function "
                        f"declarations) belong in a rule file (found {kind}); stages {', '.join(STAGES)} are declared "
                        "by the loader")
    line = _line_of(text, span.i)
    if stage not in STAGES:
        raise RuleError(f"{file}:{line}: rule {name or '(unnamed)'} needs ':ruleset' set to one of "
                        f"{', '.join(STAGES)} (got {stage or 'none'!r})")
    if not name or name.startswith("("):
        raise RuleError(f"{file}:{line}: every rule needs a ':name \"...\"'")
    return Rule(name, stage, file, line, text[span.i:span.j], reads, builds, command)


def _constructors(nodes: Iterable[Any]) -> frozenset[str]:
    """Capitalised function names (Op constructors) used anywhere in parsed egglog syntax."""
    found: set[str] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, list | tuple):
            stack.extend(node)
            continue
        kind = type(node).__name__
        if kind == "Call":
            if node.name[:1].isupper():
                found.add(node.name)
            stack.extend(node.args)
        elif kind not in ("Var", "Lit", "str", "int", "float", "bool", "NoneType"):
            stack.extend(getattr(node, a) for a in ("expr", "args", "lhs", "rhs", "left", "right")
                         if hasattr(node, a))
    return frozenset(found)

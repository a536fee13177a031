"""Saturation: run the rule stages over an encoded graph within limits.

Each stage (see :data:`rules.STAGES`) runs in chunks of a few iterations
under egglog's back-off scheduler (a rule that matches too often is banned for
a while, so one noisy rule cannot blow the e-graph up).  Between chunks the
e-graph size and the wall clock are checked against the limits.  A stage ends
when an iteration changes nothing (saturated), or at a limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from egglog import bindings as eb

from .rules import STAGES, RuleSet, egglog_rule_bases

STOP_SATURATED = "saturated"
STOP_ITERATIONS = "iteration limit"
STOP_NODES = "node limit"
STOP_TIME = "time limit"


@dataclass(frozen=True)
class SaturationLimits:
    """Bounds on saturation: iterations per stage, e-nodes, wall time, back-off knobs."""

    max_iterations: int = 30
    max_enodes: int = 500_000
    max_seconds: float = 30.0
    match_limit: int = 20_000
    ban_length: int = 3
    chunk: int = 4


@dataclass
class IterationStats:
    """Matches per rule in one chunk of one stage, and the e-graph size after it."""

    stage: str
    iterations: int
    matches: dict[str, int]
    enodes: int
    seconds: float


@dataclass
class SaturationResult:
    stop_reason: str
    stages: dict[str, str] = field(default_factory=dict)
    history: list[IterationStats] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def matches_per_rule(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for it in self.history:
            for rule, n in it.matches.items():
                total[rule] = total.get(rule, 0) + n
        return dict(sorted(total.items()))


def egraph_size(egraph: eb.EGraph) -> int:
    """Number of e-nodes (rows of Op/TensorList constructors, helper tables excluded)."""
    out = egraph.run_program(eb.PrintSize(eb.PanicSpan(), None))
    return sum(n for name, n in out[0].sizes if name[:1].isupper())


def saturate(egraph: eb.EGraph, rules: RuleSet, limits: SaturationLimits = SaturationLimits()) -> SaturationResult:
    """Run every stage in order on ``egraph`` (which holds the rules and the graph)."""
    start = time.perf_counter()
    result = SaturationResult(STOP_SATURATED)
    stages_in_use = {r.stage for r in rules.rules}
    bases = egglog_rule_bases(rules)
    for stage in STAGES:
        if stage not in stages_in_use:
            continue
        reason = _run_stage(egraph, stage, limits, start, result, bases)
        result.stages[stage] = reason
        if reason in (STOP_NODES, STOP_TIME):
            result.stop_reason = reason
            break
        if reason == STOP_ITERATIONS:
            result.stop_reason = reason
    result.seconds = time.perf_counter() - start
    return result


def _schedule(stage: str, iterations: int, limits: SaturationLimits, backoff: bool) -> list:
    if backoff:
        text = (f"(run-schedule (let-scheduler bo (back-off :match-limit {limits.match_limit} "
                f":ban-length {limits.ban_length})) (repeat {iterations} (run-with bo {stage})))")
    else:
        text = f"(run-schedule (repeat {iterations} (run {stage})))"
    return eb.EGraph().parse_program(text)


def _chunk_stats(report: eb.RunReport, per_iteration: int, bases: dict[str, str]) -> tuple[int, dict[str, int]]:
    """Iterations that matched anything, and matches per base rule (``bases``: egglog's rule names), from a report.

    Under a scheduler egglog reports each iteration as a search entry followed
    by an apply entry (``per_iteration=2``); the search entry's counts are used.
    """
    ran = 0
    matches: dict[str, int] = {}
    for entry in report.iterations[::per_iteration]:
        counts = {k: sum(r.num_matches for r in v) for k, v in entry.rule_set_report.rule_reports.items()}
        counts = {k: v for k, v in counts.items() if v}
        if counts:
            ran += 1
        for k, v in counts.items():
            matches[bases[k]] = matches.get(bases[k], 0) + v
    return ran, matches


def _run_stage(egraph: eb.EGraph, stage: str, limits: SaturationLimits, start: float,
               result: SaturationResult, bases: dict[str, str]) -> str:
    done = 0
    while done < limits.max_iterations:
        chunk = min(limits.chunk, limits.max_iterations - done)
        t0 = time.perf_counter()
        report = egraph.run_program(*_schedule(stage, chunk, limits, backoff=True))[0].report
        updated = report.updated
        ran, matches = _chunk_stats(report, per_iteration=2, bases=bases)
        if not updated:
            # Back-off may have banned a rule; one plain iteration confirms the fixpoint.
            plain = egraph.run_program(*_schedule(stage, 1, limits, backoff=False))[0].report
            updated = plain.updated
            extra_ran, extra = _chunk_stats(plain, per_iteration=1, bases=bases)
            ran += extra_ran
            for k, v in extra.items():
                matches[k] = matches.get(k, 0) + v
        size = egraph_size(egraph)
        done += chunk
        result.history.append(IterationStats(stage, max(ran, 1), matches, size, time.perf_counter() - t0))
        if not updated:
            return STOP_SATURATED
        if size > limits.max_enodes:
            return STOP_NODES
        if time.perf_counter() - start > limits.max_seconds:
            return STOP_TIME
    return STOP_ITERATIONS

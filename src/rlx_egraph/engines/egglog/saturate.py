"""Saturation: run the rule stages over an encoded graph within limits.

Stages (:data:`rules.STAGES`) run in order, one iteration at a time, and the
limits are checked after every iteration.  The *room* is how many e-nodes the
e-graph may still gain: up to ``max_enodes``, or fewer when the time left
would not cover building the view and extracting (about
:data:`DOWNSTREAM_SECONDS_PER_ENODE` each e-node), so the whole run fits
``max_seconds``, or when the memory left under ``max_memory_mb`` would not hold
them (each e-node's bytes in egglog, as measured on this run, plus
:data:`DOWNSTREAM_BYTES_PER_ENODE` for the view and extraction of every
e-node).  Memory can also grow without e-nodes (a rule that builds ever longer
strings): after each iteration, when the memory the next one is predicted to
take (the last one's growth, times how much that grew) would not fit under
``max_memory_mb``, saturation stops at the memory limit.

An iteration is either *bounded* or plain.  A bounded iteration runs under a
back-off scheduler whose per-rule match limit is small enough that all the
e-nodes the stage's rules can build (``Rule.new_enodes`` per match) fit the
room, so it cannot overshoot; a rule with more matches is not applied.  A
plain iteration is egglog's own (semi-naive: only new matches are searched,
which is much faster) and runs only when the last iteration applied every rule
and its matches predict a growth that, times :data:`SAFETY`, fits the room.
The first iteration of each stage is bounded, since nothing predicts it.  (A
plain iteration is predicted, not bounded: a rule whose matches jump more than
the prediction allows could still overshoot once.)  When
only rules over the limit are left the e-graph is unchanged, so their match
counts are exact and decide which of them still fit, fewest matches first;
when none does, saturation stops at the limit.  A stage ends when an iteration
changes nothing (saturated), or at a limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from egglog import bindings as eb

from ...checks import check_number
from ..budget import MB, Deadline, default_max_memory_mb, memory_in_use_mb
from .rules import STAGES, RuleSet, egglog_rule_bases, runtime_error

STOP_SATURATED = "saturated"
STOP_ITERATIONS = "iteration limit"
STOP_NODES = "node limit"
STOP_TIME = "time limit"
STOP_MEMORY = "memory limit"

# Building the view, extracting and decoding took 50-80 us per e-node on the
# benchmark and AC e-graphs (idle 2-core machine), about twice that under load:
# saturation leaves this much time per e-node for them.
DOWNSTREAM_SECONDS_PER_ENODE = 1.5e-4
# A plain iteration runs only while SAFETY times its predicted growth fits the room.
SAFETY = 2.0
# Memory per e-node: building the view and extracting took up to 3.8 KB per e-node (the associativity and
# commutativity e-graphs of bench_limits; 1.2 KB on the synthetic graphs), egglog itself up to 5.7 KB (0.9 KB).
# Saturation counts the second as measured on the run once MEASURED_ENODES e-nodes were added, the first always.
# The view also reads every value egglog holds: after a rule that builds long strings it took 1.2 times what
# saturation had added, so the memory left for it is at least DOWNSTREAM_FACTOR times that.
DOWNSTREAM_BYTES_PER_ENODE = 4096.0
DOWNSTREAM_FACTOR = 1.5
SATURATION_BYTES_PER_ENODE = 6144.0  # until measured
MEASURED_ENODES = 1000
# The next iteration's memory growth is predicted as the last one's times how much that grew, at most this much.
MEMORY_GROWTH_RATIO = 4.0
DEFAULT_MAX_MEMORY_MB = default_max_memory_mb()  # half of what this machine lets the process hold


@dataclass(frozen=True)
class SaturationLimits:
    """Bounds on the run."""

    max_iterations: int = 100  # per stage (a shared-input group of k matmuls takes about k)
    max_enodes: int = 500_000
    max_seconds: float = 120.0  # the whole optimize run, up to the parity check
    match_limit: int = 20_000  # matches per rule and iteration before the rule waits for the others
    max_memory_mb: float = DEFAULT_MAX_MEMORY_MB  # the process's memory while it saturates (budget.memory_in_use_mb)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_number(f.name, getattr(self, f.name), type(f.default))


@dataclass
class IterationStats:
    """Matches per rule in one iteration of one stage, and the e-graph size after it."""

    stage: str
    iterations: int
    matches: dict[str, int]
    enodes: int
    seconds: float
    match_limit: int | None = None  # None: a plain iteration; else the bounded iteration's per-rule limit


@dataclass
class SaturationResult:
    """Why saturation stopped (one of the STOP_* codes), and the same in a sentence."""

    stop_reason: str
    detail: str = STOP_SATURATED
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


@dataclass
class _Iteration:
    updated: bool
    matches: dict[str, int]  # per rule, as searched (before the match limit)
    skipped: dict[str, int]  # rules over the match limit: not applied
    limit: int | None = None  # the per-rule match limit of a bounded iteration


def egraph_size(egraph: eb.EGraph) -> int:
    """Number of e-nodes (rows of Op/TensorList constructors, helper tables excluded)."""
    out = egraph.run_program(eb.PrintSize(eb.PanicSpan(), None))
    return sum(n for name, n in out[0].sizes if name[:1].isupper())


def saturate(egraph: eb.EGraph, rules: RuleSet, limits: SaturationLimits = SaturationLimits(),
             deadline: Deadline | None = None,
             on_iteration: Callable[[IterationStats], None] | None = None) -> SaturationResult:
    """Run every stage in order on ``egraph`` (which holds the rules and the graph).

    ``deadline``: the end of the whole run (default: ``limits.max_seconds`` from now).
    ``on_iteration``: called with each iteration's statistics as it ends (progress, logging).
    """
    return _Saturation(egraph, rules, limits, deadline or Deadline(limits.max_seconds), on_iteration).run()


class _Saturation:
    def __init__(self, egraph: eb.EGraph, rules: RuleSet, limits: SaturationLimits, deadline: Deadline,
                 on_iteration: Callable[[IterationStats], None] | None = None) -> None:
        self.egraph, self.rules, self.limits, self.deadline = egraph, rules, limits, deadline
        self.on_iteration = on_iteration
        self.bases = egglog_rule_bases(rules)  # egglog's rule names (operand orders, directions) -> base rule
        self.new_enodes = {name: r.new_enodes for r in rules.rules for name in r.egglog_names}
        self.most_enodes = max(self.new_enodes.values(), default=0)
        self.stages = [s for s in STAGES if any(r.stage == s for r in rules.rules)]
        self.stage_enodes = {s: sum(r.new_enodes for r in rules.rules if r.stage == s) for s in self.stages}
        self.size = egraph_size(egraph)
        self.last_seconds = 0.0
        self.result = SaturationResult(STOP_SATURATED)
        self.first_size = self.size
        self.first_mb = self.used_mb = memory_in_use_mb()
        self.growth_mb = self.last_growth_mb = 0.0  # memory the last iteration added, and the one before it

    def run(self) -> SaturationResult:
        start = time.perf_counter()
        for stage in self.stages:
            reason, detail = self._stage(stage)
            self.result.stages[stage] = reason
            if reason != STOP_SATURATED and self.result.stop_reason == STOP_SATURATED:
                self.result.stop_reason, self.result.detail = reason, detail
            if reason in (STOP_NODES, STOP_TIME, STOP_MEMORY):
                self.result.stop_reason, self.result.detail = reason, detail
                break
        self.result.seconds = time.perf_counter() - start
        return self.result

    def _room(self) -> tuple[int, str]:
        """E-nodes the e-graph may still gain, and the limit that sets that."""
        rooms = [(self.limits.max_enodes - self.size, STOP_NODES)]
        affordable = (self.deadline.remaining() - self.last_seconds) / DOWNSTREAM_SECONDS_PER_ENODE
        if affordable < self.limits.max_enodes:
            rooms.append((int(affordable) - self.size, STOP_TIME))
        added, grown_mb = self.size - self.first_size, self.used_mb - self.first_mb
        per_enode = max(1024.0, grown_mb * MB / added) if added >= MEASURED_ENODES else SATURATION_BYTES_PER_ENODE
        left = (self.limits.max_memory_mb - self.used_mb - self._downstream_mb(self.size, grown_mb)) * MB
        each = max(per_enode + DOWNSTREAM_BYTES_PER_ENODE, per_enode * (1.0 + DOWNSTREAM_FACTOR))
        rooms.append((math.floor(left / each), STOP_MEMORY))
        return min(rooms, key=lambda r: r[0])  # (the first of equals: nodes, then time, then memory)

    @staticmethod
    def _downstream_mb(enodes: int, grown_mb: float) -> float:
        """The memory the view and extraction are predicted to take after saturation of ``enodes`` e-nodes that
        added ``grown_mb`` MB to the process."""
        return max(DOWNSTREAM_BYTES_PER_ENODE * enodes / MB, DOWNSTREAM_FACTOR * grown_mb)

    def _measure_memory(self) -> None:
        used = memory_in_use_mb()
        self.last_growth_mb, self.growth_mb, self.used_mb = self.growth_mb, max(0.0, used - self.used_mb), used

    def _memory_needed_mb(self) -> float:
        """The memory the next iteration is predicted to add (besides its e-nodes' share, which the room counts):
        the last iteration's growth, times how much that grew on the one before (1 to MEMORY_GROWTH_RATIO)."""
        ratio = min(MEMORY_GROWTH_RATIO, max(1.0, self.growth_mb / self.last_growth_mb)) if self.last_growth_mb \
            else 1.0
        return self.growth_mb * ratio

    def _stage(self, stage: str) -> tuple[str, str]:
        exact_limit: int | None = None
        last: _Iteration | None = None
        before_last = 0  # total matches of the iteration before ``last``
        for _ in range(self.limits.max_iterations):
            room, binding = self._room()
            if room <= 0:
                return binding, self._full(binding, stage)
            needed = self._memory_needed_mb()
            after = self.used_mb + needed
            if after + self._downstream_mb(self.size, after - self.first_mb) > self.limits.max_memory_mb:
                return STOP_MEMORY, (f"{STOP_MEMORY}: the process holds {self.used_mb:,.0f} MB and the next iteration "
                                     f"is predicted to add {needed:,.0f} MB, more than max_memory_mb="
                                     f"{self.limits.max_memory_mb:,.0f} leaves with the view and extraction still "
                                     f"to come (stage {stage}, {self.size:,} e-nodes)")
            t0 = time.perf_counter()
            if exact_limit is not None:
                it = self._bounded(stage, exact_limit)
            elif last is None or last.skipped or not self._plain_fits(room, last, before_last):
                it = self._bounded(stage, min(self.limits.match_limit, room // max(self.stage_enodes[stage], 1)))
            else:
                it = self._plain(stage)
            self.last_seconds = time.perf_counter() - t0
            self.size = egraph_size(self.egraph)
            self._measure_memory()
            by_base: dict[str, int] = {}
            for r, m in it.matches.items():
                if m:
                    by_base[self.bases.get(r, r)] = by_base.get(self.bases.get(r, r), 0) + m
            self.result.history.append(IterationStats(stage, 1, by_base, self.size, self.last_seconds, it.limit))
            if self.on_iteration is not None:
                self.on_iteration(self.result.history[-1])
            before_last = sum(last.matches.values()) if last else 0
            last, exact_limit = it, None
            if not it.updated:
                if not it.skipped:
                    return STOP_SATURATED, STOP_SATURATED
                # Only rules over the limit are left and the e-graph is unchanged: their counts are exact.
                exact_limit = self._limit_that_fits(it.skipped, room)
                if exact_limit is None:
                    return binding, self._no_room(binding, stage, it.skipped, room)
        return STOP_ITERATIONS, (f"{STOP_ITERATIONS}: stage {stage} did not saturate within "
                                 f"max_iterations={self.limits.max_iterations}")

    def _plain_fits(self, room: int, last: _Iteration, before_last: int) -> bool:
        """Whether a plain iteration is predicted to stay well inside the room: it is
        predicted to repeat the last one's matches, scaled by how much the match
        count grew from the iteration before, each match building all it can."""
        total = sum(last.matches.values())
        ratio = max(1.0, total / before_last) if before_last else 1.0
        if any(m * ratio > self.limits.match_limit for m in last.matches.values()):
            return False
        growth = sum(m * ratio * self._enodes_per_match(r) for r, m in last.matches.items())
        return SAFETY * growth <= room

    def _limit_that_fits(self, skipped: dict[str, int], room: int) -> int | None:
        """The largest match limit under which the skipped rules' e-nodes fit ``room``, fewest matches first."""
        fits = None
        total = 0
        for count in sorted(set(skipped.values())):
            total += sum(count * self._enodes_per_match(r) for r, m in skipped.items() if m == count)
            if total > room:
                break
            fits = count
        return fits

    def _enodes_per_match(self, reported: str) -> int:
        """``Rule.new_enodes`` of a rule by egglog's name for it (an operand order, a birewrite's
        ``name=>`` or ``name<=``); the most any rule builds if the name is unknown."""
        return self.new_enodes.get(reported, self.most_enodes)

    def _plain(self, stage: str) -> _Iteration:
        report = self._run(stage, f"(run-schedule (run {stage}))")
        return _Iteration(report.updated, _matches(report, per_iteration=1), {})

    def _bounded(self, stage: str, limit: int) -> _Iteration:
        report = self._run(stage, f"(run-schedule (let-scheduler bo (back-off :match-limit {limit})) "
                                  f"(run-with bo {stage}))")
        matches = _matches(report, per_iteration=2)
        return _Iteration(report.updated, matches, {r: m for r, m in matches.items() if m > limit}, limit)

    def _run(self, stage: str, text: str) -> eb.RunReport:
        """Run one schedule of ``stage``; a rule that fails while it is applied is a RuleError naming it."""
        try:
            return self.egraph.run_program(*self.egraph.parse_program(text))[0].report
        except eb.EggSmolError as exc:
            raise runtime_error(self.rules, stage, str(exc)) from None

    def _full(self, binding: str, stage: str) -> str:
        if binding == STOP_TIME:
            return (f"{STOP_TIME}: max_seconds={self.limits.max_seconds:g} leaves no time for more saturation "
                    f"after {self.deadline.elapsed():.1f} s (stage {stage}; {self.size:,} e-nodes to extract)")
        if binding == STOP_MEMORY:
            return (f"{STOP_MEMORY}: max_memory_mb={self.limits.max_memory_mb:,.0f} leaves no memory for more "
                    f"saturation with the process at {self.used_mb:,.0f} MB (stage {stage}; {self.size:,} e-nodes "
                    "to extract)")
        return f"{STOP_NODES}: the e-graph has {self.size:,} e-nodes, max_enodes={self.limits.max_enodes:,} " \
               f"(stage {stage})"

    def _no_room(self, binding: str, stage: str, skipped: dict[str, int], room: int) -> str:
        count = min(skipped.values())
        reported = [r for r, m in skipped.items() if m == count]
        names = sorted({self.bases.get(r, r) for r in reported})  # the rules as written, not their orders
        enodes = sum(count * self._enodes_per_match(r) for r in reported)
        limit = {STOP_TIME: f"max_seconds={self.limits.max_seconds:g}",
                 STOP_MEMORY: f"max_memory_mb={self.limits.max_memory_mb:,.0f}"}.get(
                     binding, f"max_enodes={self.limits.max_enodes:,}")
        who = f"rule {names[0]} has" if len(names) == 1 else f"rules {', '.join(names)} have"
        return (f"{binding}: {who} {count:,} matches, which could add {enodes:,} e-nodes, more than the {room:,} "
                f"that {limit} leaves (stage {stage}, {self.size:,} e-nodes)")


def _matches(report: eb.RunReport, per_iteration: int) -> dict[str, int]:
    """Matches per rule from a one-iteration run report.

    Under a scheduler egglog reports an iteration as a search entry followed by
    an apply entry (``per_iteration=2``); the search entry's counts are used.
    """
    matches: dict[str, int] = {}
    for entry in report.iterations[::per_iteration]:
        for rule, reports in entry.rule_set_report.rule_reports.items():
            matches[rule] = matches.get(rule, 0) + sum(r.num_matches for r in reports)
    return matches

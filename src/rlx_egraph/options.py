"""The options of ``optimize``: one frozen :class:`Options`, checked when it is made.

An option's type comes from its default (a bool option takes a bool, an int option an int, a float option a real
number; the saturation limits' defaults are :class:`SaturationLimits`'); choices and lower bounds are below (every
other number is >= 0, and an int is below 2**63 because it may reach egglog as an i64).  A value of the wrong type
raises TypeError, a value out of range ValueError, an unknown name TypeError with the closest known name; each
message names the option.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .checks import check_number as _check_number
from .checks import show as _show
from .cost import Target
from .cost.targets import TARGETS, check_dim_hints
from .engines.egglog.rules import RuleSet
from .engines.egglog.saturate import SaturationLimits

ENGINES = ("auto", "egglog", "fallback")
EXTRACTIONS = ("greedy", "exact")
CHOICES: dict[str, tuple[str, ...]] = {"engine": ENGINES, "extraction": EXTRACTIONS, "target": tuple(TARGETS)}


@dataclass(frozen=True, kw_only=True)
class Options:
    """Every option of :func:`~rlx_egraph.optimize` and :func:`~rlx_egraph.optimize_with_report`, checked when made.

    ``optimize(graph, options=Options(target="cuda", verify=True))`` and ``optimize(graph, target="cuda",
    verify=True)`` are the same run: keywords build an ``Options`` (over ``options=`` when both are given).
    ``options.replace(engine="fallback")`` is a copy with some options changed, checked again.

    Attributes:
        target: the cost model: ``"cpu"``, ``"cuda"``, ``"metal"``, ``"wgpu"``, ``"onnxruntime"`` or a
            :class:`~rlx_egraph.cost.Target`.
        rules: None for the shipped rules (with a front end's own rules for a graph it made:
            ``graph.meta["source"]``), a :class:`~rlx_egraph.RuleSet`, or rule files and folders.
        verify: check every node against the input graph with numpy (raises ParityError); None checks when rules
            from outside the shipped set are loaded (``report.verification`` says whether and why); a mapping gives
            reference values for some or all inputs by name and checks on them (a symbolic graph is then checked
            at the sizes their shapes give its symbols; the other leaves are drawn).
        engine: ``"egglog"``, ``"fallback"``, or ``"auto"``: the fallback above 100,000 nodes, and when an egglog
            saturation stops at a limit.
        extraction: ``"greedy"``, or ``"exact"``: an integer program solved by HiGHS.
        exact_gap: also solve the exact problem and report its optimum beside the extraction's cost.
        attention_block_max_tokens: the largest batch*seq a FusedAttentionBlock is built for; None: the
            target's (:attr:`Target.attention_block_max_tokens <rlx_egraph.cost.Target.attention_block_max_tokens>`).
        regions: fuse remaining elementwise chains into ElementwiseRegion nodes (a pass after extraction; only on
            targets with region kernels, only where it pays).  Whatever it says, a region longer or wider than the
            target's region kernels take is clipped to the target's limits (``report.regions_clipped``).
        seed: the first seed of the verifier's random data.
        strict: raise UnsoundRewrite when a rule built an ill-typed e-node or merged input-graph nodes of different
            types.  Otherwise ill-typed e-nodes are left out of extraction and listed in ``report.ill_typed``, and
            after a bad merge the input graph is returned unchanged (the reason in ``report.stop_reason``).
        dim_hints: the sizes symbolic dims are priced at (symbol -> int), over those the graph carries
            (``graph.meta["dim_hints"]``) over the target's.
        max_iterations: saturation iterations per stage.
        max_enodes: the e-nodes the e-graph may reach.
        max_seconds: the budget of the whole run, up to the parity check (both engines share it).
        match_limit: matches per rule and iteration before the rule waits for the others.
        max_memory_mb: the process's memory while it saturates.
    """

    target: str | Target = "cpu"
    rules: Any = None
    verify: bool | Mapping[str, Any] | None = None
    engine: str = "auto"
    extraction: str = "greedy"
    exact_gap: bool = False
    attention_block_max_tokens: int | None = None
    regions: bool = True
    seed: int = 0
    strict: bool = False
    dim_hints: Mapping[str, int] | None = None
    max_iterations: int = SaturationLimits.max_iterations
    max_enodes: int = SaturationLimits.max_enodes
    max_seconds: float = SaturationLimits.max_seconds
    match_limit: int = SaturationLimits.match_limit
    max_memory_mb: float = SaturationLimits.max_memory_mb

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_option(f.name, getattr(self, f.name), f.default)

    @property
    def limits(self) -> SaturationLimits:
        """The saturation limits among these options."""
        return SaturationLimits(**{name: getattr(self, name) for name in LIMIT_NAMES})

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes`` (option name -> value), checked."""
        check_names(changes)
        return dataclasses.replace(self, **changes)


NAMES = tuple(f.name for f in dataclasses.fields(Options))
LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(SaturationLimits))


def _checked_init(init: Any) -> Any:
    """``Options.__init__``, raising the option error (with the closest known name) for an unknown keyword."""

    @functools.wraps(init)
    def checked(self: Options, **given: Any) -> None:
        check_names(given)
        init(self, **given)

    return checked


Options.__init__ = _checked_init(Options.__init__)  # type: ignore[method-assign]


def check_names(names: Iterable[str]) -> None:
    """TypeError naming the first of ``names`` that is no option, and the closest option's name."""
    for key in names:
        if key not in NAMES:
            close = difflib.get_close_matches(key, NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(NAMES)})"
            raise TypeError(f"unknown optimize option {key!r}{hint}")


def build_options(options: Options | None, keywords: Mapping[str, Any]) -> Options:
    """The options of a call: ``options`` (None: the defaults) with the ``keywords`` given (name -> value)."""
    if options is None:
        return Options(**keywords)
    if not isinstance(options, Options):
        raise TypeError(f"options must be an rlx_egraph.Options, got {_show(options)}")
    return options.replace(**keywords) if keywords else options


def check_option(name: str, value: Any, default: Any) -> None:
    """Check one option ``name`` against the type of its ``default`` and its choices and range."""
    if name == "rules":
        _check_rules(value)
    elif name == "verify":
        if isinstance(value, Mapping):
            if not all(isinstance(k, str) for k in value):
                raise TypeError(f"verify's reference inputs must be keyed by input name, got {_show(value)}")
        elif value is not None and not isinstance(value, bool):
            raise TypeError(f"verify must be True, False, None (check when rules from outside the shipped set "
                            f"are loaded) or a mapping of reference inputs (name -> array), got {_show(value)}")
    elif name == "dim_hints":
        if value is not None:
            check_dim_hints(value, name)
    elif name == "attention_block_max_tokens":
        if value is not None:
            _check_number(name, value, int)
    elif name == "target" and isinstance(value, Target):
        pass
    elif name in CHOICES:
        allowed = f"one of {CHOICES[name]}" + (" or a cost.Target" if name == "target" else "")
        if not isinstance(value, str):
            raise TypeError(f"{name} must be {allowed}, got {_show(value)}")
        if value not in CHOICES[name]:
            close = difflib.get_close_matches(value, CHOICES[name], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{name} must be {allowed}, got {value!r}{hint}")
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {_show(value)}")
    elif isinstance(default, int | float):
        _check_number(name, value, type(default))


def rules_outside_shipped(ruleset: RuleSet) -> tuple[str, ...]:
    """The rule files of ``ruleset`` (as messages name them) whose text is not that of a shipped rule file."""
    return tuple(ruleset.outside_shipped())


def verification_choice(verify: bool | Mapping[str, Any] | None,
                        ruleset: RuleSet) -> tuple[bool, str, tuple[str, ...]]:
    """Whether a run checks its values (``verify``: True, False, reference inputs by name, or None for the
    default: when rules from outside the shipped set are loaded), why, in words, and those rules' files."""
    outside = rules_outside_shipped(ruleset)
    if isinstance(verify, Mapping):
        given = ", ".join(map(repr, sorted(verify))) or "none"
        return True, f"requested with reference inputs ({given})", outside
    if verify:
        return True, "requested (verify=True)", outside
    if verify is False:
        loaded = f", although rules from outside the shipped set were loaded: {', '.join(outside)}" if outside else ""
        return False, f"switched off (verify=False){loaded}", outside
    if outside:
        return True, f"rules from outside the shipped set: {', '.join(outside)}", outside
    return False, "only shipped rules, which the test suite checks", outside


def _check_rules(value: Any) -> None:
    """``rules``: None, a RuleSet, a rule file or folder, or a list or tuple of files and folders."""
    paths = value if isinstance(value, list | tuple) else [value]
    if value is None or isinstance(value, RuleSet) or all(isinstance(p, str | os.PathLike) for p in paths):
        return
    raise TypeError(f"rules must be None, a rule file or folder (a str or Path) or a list of them, got {_show(value)}")


__all__ = ["CHOICES", "ENGINES", "EXTRACTIONS", "LIMIT_NAMES", "NAMES", "Options", "build_options", "check_names",
           "check_option", "rules_outside_shipped", "verification_choice"]

"""The options of ``optimize_with_report``, checked at the door.

An option's type comes from its default in the signature (a bool option takes a
bool, an int option an int, a float option a real number), a saturation limit's
from its default in :class:`SaturationLimits`; choices and lower bounds are
below (every other number is >= 0, and an int is below 2**63 because it may
reach egglog as an i64).  A value of the wrong type raises TypeError, a value
out of range ValueError, an unknown name TypeError with the closest known name;
each message names the option.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from .checks import check_number as _check_number
from .checks import show as _show
from .cost import Target
from .cost.targets import TARGETS, check_dim_hints
from .engines.egglog.rules import RuleSet, default_rule_dir
from .engines.egglog.saturate import SaturationLimits
from .ir.graph import Graph

ENGINES = ("auto", "egglog", "fallback")
EXTRACTIONS = ("greedy", "exact")
CHOICES: dict[str, tuple[str, ...]] = {"engine": ENGINES, "extraction": EXTRACTIONS, "target": tuple(TARGETS)}
LIMIT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SaturationLimits)}


def check_options(function: Callable[..., Any], given: Mapping[str, Any]) -> None:
    """Check the arguments ``given`` to ``function`` (its ``locals()`` on entry: parameter name -> value).

    The ``**`` parameter holds the saturation limits by name.
    """
    params = inspect.signature(function).parameters
    for name, param in params.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            for key, value in given[name].items():
                if key not in LIMIT_DEFAULTS:
                    known = [*(p for p in params if p != name), *LIMIT_DEFAULTS]
                    close = difflib.get_close_matches(key, known, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
                    raise TypeError(f"unknown optimize option {key!r}{hint}")
                check_option(key, value, LIMIT_DEFAULTS[key])
        else:
            check_option(name, given[name], param.default)


def check_option(name: str, value: Any, default: Any) -> None:
    """Check one option ``name`` against the type of its ``default`` and its choices and range."""
    if name == "graph":
        if not isinstance(value, Graph):
            raise TypeError(f"graph must be an rlx_egraph.Graph, got {_show(value)}")
    elif name == "rules":
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
            either = " or a mapping of reference inputs (name -> array)" if name == "verify" else ""
            raise TypeError(f"{name} must be True or False{either}, got {_show(value)}")
    elif isinstance(default, int | float):
        _check_number(name, value, type(default))


def rules_outside_shipped(ruleset: RuleSet) -> tuple[str, ...]:
    """The rule files of ``ruleset`` (as messages name them) whose text is not that of a shipped rule file."""
    shipped = {path.read_bytes() for path in default_rule_dir().rglob("*.egg")}
    return tuple(dict.fromkeys(display for _, display, data in ruleset.sources if data not in shipped))


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


__all__ = ["CHOICES", "ENGINES", "EXTRACTIONS", "check_option", "check_options", "rules_outside_shipped",
           "verification_choice"]

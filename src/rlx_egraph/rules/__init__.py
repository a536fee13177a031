"""Rules: the rule model, loaded once from ``.egg`` text; combine and check rule sets.

* :class:`RuleSet` (``shipped``, ``from_files``, ``from_strings``, ``+``, ``extend``, ``without``, ``list``)
  owns the :class:`Rule` records, parsed once from their files (:mod:`.parse`).
* A rule is data (:mod:`.model`): a query of :class:`Pattern`, :class:`Fact` and :class:`Guard` atoms over
  terms (:mod:`.terms`), and actions (:data:`Action`), with its operand orders (:mod:`.variants`) and its
  ``file:line``.
* The fact tables (:data:`FACT_TABLES`) and primitives (:data:`PRIMITIVES`) rules use are defined once, with
  their meaning in Python; :mod:`.emit` writes the model as egglog.
* :func:`check` is the soundness checker.

The shipped ``.egg`` files are in the repository's ``rules/`` folder; the wheel ships them as the package data
folder ``rlx_egraph/shipped_rules`` (see :func:`default_rule_dir`).
"""

# The soundness checker runs rules in the egglog engine, whose modules import this package's modules (not this
# package): rlx_egraph.egraph imports this package first.
from ..egraph.soundness import RuleVerdict, SoundnessReport, check
from .model import (
    BIREWRITE,
    REWRITE,
    RULE,
    STAGE_DOCS,
    STAGES,
    Action,
    Atom,
    Build,
    Declaration,
    Direction,
    Fact,
    Guard,
    Insert,
    Let,
    Panic,
    Pattern,
    Rule,
    RuleError,
    SetValue,
    Union,
    action_terms,
    atom_terms,
    atom_variables,
    rename_atom,
)
from .primitives import PRIMITIVES, NoValue, Primitive
from .ruleset import RuleSet, default_rule_dir, load_rules
from .tables import FACT_TABLES, FactSource, FactTable, GraphFacts
from .terms import Absent, Call, Lit, Lookup, OpTerm, TensorList, Term, Var, rename, subterms, variables

__all__ = ["BIREWRITE", "FACT_TABLES", "PRIMITIVES", "REWRITE", "RULE", "STAGES", "STAGE_DOCS", "Absent", "Action",
           "Atom", "Build", "Call", "Declaration", "Direction", "Fact", "FactSource", "FactTable", "GraphFacts",
           "Guard", "Insert", "Let", "Lit", "Lookup", "NoValue", "OpTerm", "Panic", "Pattern", "Primitive", "Rule",
           "RuleError", "RuleSet", "RuleVerdict", "SetValue", "SoundnessReport", "TensorList", "Term", "Union", "Var",
           "action_terms", "atom_terms", "atom_variables", "check", "default_rule_dir", "load_rules", "rename",
           "rename_atom", "subterms", "variables"]

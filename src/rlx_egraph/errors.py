"""The base class of every error rlx-egraph raises on purpose.

``except rlx_egraph.RlxError`` catches them all; each also keeps its builtin
base (a GraphError is still a ValueError, a ParityError an AssertionError).
The errors themselves live next to the code that raises them and are
importable from the top level: ``GraphError`` (and ``OnnxImportError``),
``ShapeError``, ``RuleError``, ``UnsoundRewrite``, ``UnsupportedOp``, ``ParityError``.
"""


class RlxError(Exception):
    """An error rlx-egraph raises on purpose; the message names the node, op, rule or ``file:line``."""

"""The ``rlx_egraph`` logger, and egglog's loggers set to WARNING (imported first by the package).

The logger has a NullHandler, so nothing is printed unless the application configures logging; what each
level shows is in docs/logging.md.  egglog logs every command and rule through Python's ``logging``
(thousands of records per run): its loggers are set to WARNING here unless the application gave them a
level of its own.
"""

from __future__ import annotations

import logging

LOGGER = logging.getLogger("rlx_egraph")
LOGGER.addHandler(logging.NullHandler())
# the Rust crates of the egglog bindings (pyo3-log names a record's logger after its crate and module)
EGGLOG_LOGGERS = ("egglog", "egglog_ast", "egglog_bridge", "egglog_concurrency", "egglog_core_relations",
                  "egglog_experimental", "egglog_numeric_id", "egglog_reports", "egglog_union_find")


def quiet_egglog() -> None:
    """Set egglog's loggers to WARNING, except those the application gave a level."""
    for name in EGGLOG_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


quiet_egglog()

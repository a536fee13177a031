"""The ``rlx-egraph`` command line (see :mod:`rlx_egraph.cli.main`)."""

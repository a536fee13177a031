from rlx_egraph.engines.egglog._flat cimport FlatEGraph, Memo
from rlx_egraph.engines.egglog._rows cimport ENode

cdef double _INF

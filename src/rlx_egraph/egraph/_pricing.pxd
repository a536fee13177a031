from rlx_egraph.egraph._flat cimport FlatEGraph, Memo
from rlx_egraph.egraph._rows cimport ENode

cdef double _INF

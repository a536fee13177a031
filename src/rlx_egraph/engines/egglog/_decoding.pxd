from rlx_egraph.engines.egglog._flat cimport FlatEGraph, Heap, Memo
from rlx_egraph.engines.egglog._rows cimport EClass, ENode

cdef double _INF

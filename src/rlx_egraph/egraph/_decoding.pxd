from rlx_egraph.egraph._flat cimport FlatEGraph, Heap, Memo
from rlx_egraph.egraph._rows cimport EClass, ENode

cdef double _INF

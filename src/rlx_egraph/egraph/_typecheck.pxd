from rlx_egraph.egraph._flat cimport FlatEGraph
from rlx_egraph.egraph._rows cimport ENode


cdef int _DEADLINE_STRIDE

# The C fields of _choice.py's ClassChoice and the helpers the compiled solver calls (cimport).

from rlx_egraph.engines.egglog._flat cimport FlatEGraph, Heap

cdef double _INF


cdef class ClassChoice:
    cdef int[::1] node
    cdef int count


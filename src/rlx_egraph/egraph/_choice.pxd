# The C fields of _choice.py's ClassChoice and the helpers the compiled solver calls (cimport).

from rlx_egraph.egraph._flat cimport FlatEGraph, Heap


cdef class ClassChoice:
    cdef int[::1] node
    cdef int count


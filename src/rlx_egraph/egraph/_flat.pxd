# The C fields of _flat.py's classes and the helpers the other compiled passes call (cimport).

cimport cython

from rlx_egraph.egraph._rows cimport ENode


cdef Py_ssize_t address(object thing)


cdef class FlatEGraph:
    cdef int[::1] child_start, child, parent_start, parent, member_start, member, eclass
    cdef readonly int num_nodes, num_classes
    cpdef object distinct_children(self)
    cdef tuple signature(self, ENode node, int n, int[::1] numbers, long long extra, bint with_attrs)


@cython.final
cdef class Heap:
    cdef double[::1] keys
    cdef int[::1] ids
    cdef Py_ssize_t size
    cdef int push(self, double key, int id) except -1
    cdef void pop(self) noexcept
    cdef int _grow(self) except -1



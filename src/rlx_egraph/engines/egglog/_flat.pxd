# The C fields of _flat.py's classes and the helpers the other compiled passes call (cimport).

cimport cython

from rlx_egraph.engines.egglog._rows cimport ENode


cdef Py_ssize_t address(object thing) noexcept
cdef object _grown(long long[::1] words, Py_ssize_t size)
cdef unsigned long long _MIX, _SCRAMBLE


cdef class FlatEGraph:
    cdef int[::1] child_start, child, parent_start, parent, member_start, member, eclass
    cdef readonly int num_nodes, num_classes
    cpdef object distinct_children(self)


@cython.final
cdef class Heap:
    cdef double[::1] keys
    cdef int[::1] ids
    cdef Py_ssize_t size
    cdef int push(self, double key, int id) except -1
    cdef void pop(self) noexcept
    cdef int _grow(self) except -1


@cython.final
cdef class Memo:
    cdef long long[::1] key, words, hashes
    cdef int[::1] first, slots
    cdef Py_ssize_t width, used
    cdef readonly int count
    cdef dict numbers
    cdef inline void start(self) noexcept
    cdef inline int add(self, long long word) except -1
    cdef int number(self) except -1
    cdef bint _holds(self, int number) noexcept
    cdef int _insert(self, long long code, Py_ssize_t at) except -1
    cdef int _rehash(self) except -1
    cdef int enode(self, FlatEGraph g, ENode node, int n, int[::1] numbers, long long extra, bint with_attrs) except -1

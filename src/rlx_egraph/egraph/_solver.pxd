# The C fields and methods of _solver.py's classes (an augmenting .pxd: Cython compiles _solver.py with them).

cimport cython

from rlx_egraph.egraph._choice cimport ClassChoice
from rlx_egraph.egraph._flat cimport FlatEGraph

cdef double _EPS
cdef int _MAX_RELEASED_READERS, _ATTEMPTS_PER_CLOCK


@cython.final
cdef class IntVec:
    cdef int[::1] data
    cdef Py_ssize_t size
    cdef int push(self, int x) except -1 nogil
    cdef int _grow(self) except -1 nogil
    cdef int extend(self, IntVec other) except -1 nogil


@cython.final
cdef class Log:
    cdef IntVec steps, switched_class, switched_node
    cdef void clear(self) noexcept nogil
    cdef int extend(self, Log other) except -1 nogil


cdef class Solver:
    cdef readonly object view
    cdef readonly long switches
    cdef int[::1] child_start, child, parent_start, parent, member_start, member, eclass, by_cost
    cdef int[::1] choice, refs_, stamp
    cdef double[::1] costs, pos, rank_keys
    cdef char[::1] ranked, usable, free_leaf, is_pending
    cdef int[::1] rank_ids
    cdef int stamp_now
    cdef Log move_log, group_log, release_log, trial_log
    cdef IntVec newly_live, read, work, brought, seen, reader_class, reader_node, alt_start, alts
    cdef IntVec candidates, pending
    cdef int[::1] reader_head, reader_tail
    cdef IntVec reader_next, reader_rank
    cdef int reader_free
    cdef bint searched, stopped

    cdef int _check_class(self, int c) except -1
    cdef int _check_member(self, int c, int n) except -1
    cdef int _restart_class(self, int c, int n) except -1
    cdef int _note_reader(self, int d, int rank) except -1 nogil
    cdef void _clear_readers(self, int d) noexcept nogil
    cdef double _incref(self, int c, Log log) except? -1.0 nogil
    cdef double _decref(self, int c, Log log) except? -1.0 nogil
    cdef double _count(self, int c, Log log, int step) except? -1.0 nogil
    cdef double _switch(self, int c, int n, Log log) except? -1.0 nogil
    cdef void _undo(self, Log log) noexcept nogil
    cdef int _read_log(self, Log log) except -1 nogil
    cdef int _improve(self, double end, int max_passes, int max_group, IntVec heap, char[::1] queued) except -1 nogil
    cdef int _rank_candidates(self) except -1
    cdef int _wake(self, int d, int at, IntVec heap, char[::1] queued) except -1 nogil
    cdef int _attempt(self, int c, int max_group) except -1 nogil
    cdef void _rank(self, int c) noexcept nogil
    cdef int _try_move(self, int c, int n, int max_group) except -1 nogil
    cdef double _release(self, int c, int old, Log log) except? -1.0 nogil
    cdef bint _reads(self, int n, int ch) noexcept nogil
    cdef double _switch_away(self, int ch, Log log) except? -1.0 nogil


cdef extern from *:
    """
    #ifdef _WIN32
    #include <windows.h>
    static double rlx_monotonic_seconds(void) {
        LARGE_INTEGER frequency, now;
        QueryPerformanceFrequency(&frequency);
        QueryPerformanceCounter(&now);
        return (double)now.QuadPart / (double)frequency.QuadPart;
    }
    #else
    #include <time.h>
    static double rlx_monotonic_seconds(void) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
    }
    #endif
    """
    double rlx_monotonic_seconds() noexcept nogil

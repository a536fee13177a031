# The C fields of _rows.py's classes, for the compiled passes that read them (cimport).

cdef Py_ssize_t _DEADLINE_STRIDE


cdef class ENode:
    cdef public object index  # its place in ``EGraphView.nodes``
    cdef public str op
    cdef public tuple children  # class ids, in the op's input order
    cdef public dict attrs  # shared by the e-nodes of one op with equal attributes: read it, never modify it
    cdef public object eclass
    cdef public object original  # graph node id when this e-node is that node, else None
    cdef public tuple built_by  # rules whose actions constructed this e-node


cdef class EClass:
    cdef public object id
    cdef public list nodes
    cdef public object type  # a TensorType (TupleType for a multi-result op), None when it has none
    cdef public list originals  # graph node ids in this class
    cdef public tuple merged_by  # rules that unioned something into this class


cdef class ClassNumbers:
    cdef dict number_of
    cdef public int count
    cdef object number(self, object value)


cdef class ListCells:
    cdef dict cells
    cdef void extend(self, object value, list out) except *


cdef class RuleRelation:
    cdef dict names

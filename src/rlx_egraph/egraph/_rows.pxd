"""The fields of the view's compiled classes (defined in ``_rows.pyx``), for the compiled passes to read
directly (``cimport``)."""


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

from rlx_egraph.egraph._flat cimport FlatEGraph, Heap
from rlx_egraph.egraph._rows cimport EClass, ENode

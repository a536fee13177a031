from rlx_egraph.engines.egglog._flat cimport FlatEGraph, Heap
from rlx_egraph.engines.egglog._rows cimport EClass, ENode

"""price_export: the exported model priced node by node, run-time shape nodes and unwritten layout nodes included."""

from collections import Counter

import onnx
import pytest

from onnx_models import F, OnnxBuilder
from rlx_egraph import Graph
from rlx_egraph.cost import TARGETS, profile
from rlx_egraph.onnx import import_model, price_export

ORT = TARGETS["onnxruntime"]


def _heads_model(flatten_pair: bool) -> onnx.ModelProto:
    """x [batch, seq, 16] @ w, its heads split by a Reshape to a run-time target [batch, seq, 4, 4] (Shape, Gather,
    Unsqueeze, Concat, as TorchScript writes it) and a Transpose, then the heads' rows flattened to [batch*seq*4, 4]
    (a target whose symbolic dim is no copy of an input dim: computed at run time in the export too); and x @ w @ v,
    with (``flatten_pair``) the product flattened to [batch*seq, 16] and unflattened back before the second
    MatMul."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", "seq", 16])
    h = m.op("MatMul", [x, m.weight("w", 16, 16)])
    b, s = m.dims(h, 0, 1)
    rows = m.op("Concat", [m.op("Mul", [m.op("Mul", [b, s]), m.ints(4)]), m.ints(4)], axis=0)
    heads = m.op("Reshape", [m.split_heads(h, 4, 4), rows])
    if flatten_pair:
        b, s = m.dims(h, 0, 1)
        flat = m.op("Reshape", [h, m.op("Concat", [m.op("Mul", [b, s]), m.ints(16)], axis=0)])
        h = m.op("Reshape", [flat, m.op("Concat", [b, s, m.ints(16)], axis=0)])
    y = m.op("MatMul", [h, m.weight("v", 16, 16)])
    return m.model({"heads": heads, "y": y})


def test_run_time_shape_nodes_are_priced_and_cancelled_reshapes_are_not():
    graph = import_model(_heads_model(flatten_pair=True))
    assert sorted(graph.symbols) == ["batch", "seq"]
    assert Counter(n.op for n in graph.nodes)["Reshape"] == 4  # the head split, the rows and the flatten pair
    priced = price_export(graph, ORT)
    # the head split's target [batch, seq, 4, 4] copies its input's dims (a constant [0, 0, 4, 4]); the rows' target
    # [batch*seq*4, 4] is computed at run time: one Shape per symbol, two Muls and a Concat; the flatten pair is a
    # reshape to the shape its source has, which the export writes as no node at all
    assert priced.added == Counter({"Shape": 2, "Mul": 2, "Concat": 1})
    assert priced.added_ns == pytest.approx(5 * ORT.shape_node_ns)
    # each at what the calibration measures a shape computation's node at, else at a dispatch
    assert price_export(graph, ORT.replace(shape_ns=1_000.0)).added_ns == pytest.approx(5_000.0)
    assert price_export(graph, ORT.replace(shape_ns=0.0)).added_ns == pytest.approx(5 * ORT.dispatch_ns)
    assert priced.unwritten == Counter({"Reshape": 2})
    exported = Counter(n.op_type for n in priced.model.graph.node)
    assert exported == Counter({"MatMul": 2, "Shape": 2, "Mul": 2, "Concat": 1, "Reshape": 2, "Transpose": 1,
                                "Identity": 2})
    assert priced.nodes == 10  # what onnxruntime dispatches: the exported nodes but the output Identities
    # the same graph without the pair: its profile is the export's, less the shape nodes
    plain = import_model(_heads_model(flatten_pair=False))
    assert priced.profile.ns - priced.unwritten_ns == pytest.approx(profile(plain, ORT).ns)
    assert priced.ns == pytest.approx(profile(plain, ORT).ns + 5 * ORT.shape_node_ns)
    assert price_export(plain, ORT).ns == pytest.approx(priced.ns)


def test_a_static_export_adds_no_shape_nodes():
    graph = import_model(_heads_model(flatten_pair=False), {"x": (2, 5, 16)})
    priced = price_export(graph, ORT)
    assert priced.added == Counter() and priced.unwritten == Counter()
    assert priced.ns == pytest.approx(profile(graph, ORT).ns)
    assert priced.nodes == profile(graph, ORT).launches == 5  # MatMul, Reshape, Transpose, Reshape, MatMul


def test_nodes_past_what_the_samples_ran_are_priced():
    """MatMulBT's samples ran as one MatMul (the Transpose of a weight is folded when the session loads); of an
    intermediate, its Transpose is a node more."""
    assert ORT.sample_nodes["MatMulBT"] == 1
    g = Graph("bt")
    x, z = g.input("x", (4, 8)), g.input("z", (6, 8))
    of_weight = g.matmul_bt(x, g.param("w", (6, 8)))
    of_value = g.matmul_bt(x, g.sigmoid(z))
    g.set_outputs([g.add(of_weight, of_value)])
    priced = price_export(g, ORT)
    assert Counter(n.op_type for n in priced.model.graph.node) == Counter(
        {"Transpose": 2, "MatMul": 2, "Sigmoid": 1, "Add": 1, "Identity": 1})
    assert priced.beyond == Counter({"MatMulBT": 1}) and priced.added == Counter() and priced.unwritten == Counter()
    assert priced.added_ns == pytest.approx(ORT.shape_node_ns)
    assert priced.ns == pytest.approx(profile(g, ORT).ns + ORT.shape_node_ns)
    assert priced.nodes == 5  # Sigmoid, its Transpose, 2 MatMul, Add: the weight's Transpose folded, no Identity

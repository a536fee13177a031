"""Per-node provenance: the rules that built each optimized node and merged into
its e-class, as recorded during saturation (not guessed from which fired rules
could build its op)."""

from pathlib import Path

import pytest
from egglog import bindings as eb

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.cost import get_target
from rlx_egraph.engines.egglog import extract as ex
from rlx_egraph.engines.egglog.decode import decode
from rlx_egraph.engines.egglog.encode import encode_graph
from rlx_egraph.engines.egglog.rules import STAGES, default_rule_dir, load_rules
from rlx_egraph.engines.egglog.saturate import saturate
from rlx_egraph.engines.egglog.schema import LIST_CONS, LIST_NIL, NO_INPUT, schema_text
from rlx_egraph.engines.egglog.view import UnsoundRewrite, build_view
from rlx_egraph.kernels.parity import ParityError
from rlx_egraph.optimize import blame

# Two user rules that both build Relu: one right (max(x, 0) = relu(x)), one wrong (exp(-x) is not relu(x)).
TWO_RELU_MAKERS = (';; right: max(x, 0) is relu(x)\n'
                   '(rewrite (Max ?x (Scalar 0.0 ?dt)) (Relu ?x) :ruleset fuse :name "max-zero-relu")\n'
                   ';; wrong on purpose\n'
                   '(rewrite (Exp (Neg ?x)) (Relu ?x) :ruleset fuse :name "exp-neg-relu")\n')


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "user.egg"
    path.write_text(text)
    return path


def saturated(graph: Graph, rules):
    """Encode, saturate and view ``graph`` the way ``optimize`` does; returns the e-graph, view and result."""
    ruleset = load_rules(rules)
    encoding = encode_graph(graph)
    egraph = eb.EGraph()
    egraph.run_program(*egraph.parse_program(schema_text() + "".join(f"(ruleset {s})" for s in STAGES)))
    egraph.run_program(*ruleset.commands())
    egraph.run_program(*egraph.parse_program(encoding.text))
    result = saturate(egraph, ruleset)
    return egraph, build_view(egraph, graph, encoding.constants, ruleset), result


def test_of_two_rules_that_build_the_same_op_only_the_one_that_built_the_node_is_named(tmp_path):
    path = write(tmp_path, TWO_RELU_MAKERS)
    g = Graph()
    x = g.input("x", (4, 8))
    y = g.input("y", (4, 8))
    g.set_outputs([g.max(y, g.scalar(0.0)), g.exp(g.neg(x))])  # both rules fire, each on its own node
    _, report = optimize_with_report(g, rules=[default_rule_dir(), path], regions=False, verify=False)
    assert report.matches_per_rule["max-zero-relu"] >= 1 and report.matches_per_rule["exp-neg-relu"] >= 1
    assert [(f.op, f.rules, f.replaces) for f in report.fusions] == [
        ("Relu", ("max-zero-relu",), (3,)), ("Relu", ("exp-neg-relu",), (5,))]
    with pytest.raises(ParityError) as err:
        optimize_with_report(g, rules=[default_rule_dir(), path], regions=False, verify=True)
    assert str(err.value).startswith("parity failure: node 3 (Relu) differs from original node 5 (Exp)")
    assert str(err.value).endswith(f"built by rule(s): exp-neg-relu ({path}:4)")


def test_a_rule_that_only_merges_is_named_as_the_merger(tmp_path):
    path = write(tmp_path, ';; wrong on purpose\n(rewrite (Relu ?x) ?x :ruleset fuse :name "wrong-relu")\n')
    g = Graph()
    x = g.input("x", (4, 8))
    y = g.input("y", (4, 8))
    g.set_outputs([g.relu(g.neg(x)), g.relu(g.relu(y))])  # relu-relu (simplify) fires on the second output
    with pytest.raises(ParityError) as err:
        optimize_with_report(g, rules=[default_rule_dir(), path], verify=True)
    # the optimized graph's input x now stands for Relu(y) (relu-relu merged Relu(Relu(y)) with Relu(y))
    assert str(err.value).startswith("parity failure: node 1 (Input) differs from original node 4 (Relu) on seed 0")
    assert str(err.value).endswith(f"built by rule(s): wrong-relu ({path}:2), relu-relu")  # the user's rule first


def test_a_region_carries_the_builders_and_mergers_of_its_steps(tmp_path):
    path = write(tmp_path, ';; wrong on purpose\n(rewrite (Relu ?x) ?x :ruleset fuse :name "wrong-relu")\n')
    g = Graph()
    x = g.input("x", (8, 16))
    g.set_outputs([g.exp(g.relu(g.mul(x, g.sigmoid(x))))])  # -> one region of Silu and Exp
    _, report = optimize_with_report(g, rules=[default_rule_dir(), path], verify=False)
    assert [(f.op, f.rules) for f in report.fusions] == [
        ("ElementwiseRegion", ("pass:elementwise-region", "silu-mul-sigmoid"))]
    with pytest.raises(ParityError) as err:
        optimize_with_report(g, rules=[default_rule_dir(), path], verify=True)
    assert str(err.value).startswith("parity failure: node 2 (ElementwiseRegion) differs from original node 4 (Exp)")
    assert str(err.value).endswith(f"built by rule(s): wrong-relu ({path}:2), pass:elementwise-region, "
                                   "silu-mul-sigmoid")


def test_unsound_rewrite_names_the_rule_that_built_the_ill_typed_node(tmp_path):
    path = write(tmp_path, TWO_RELU_MAKERS + ';; wrong on purpose: changes the shape\n'
                                             '(rewrite (Narrow ?x ?axis ?start ?len) (Relu ?x) :ruleset fuse '
                                             ':name "narrow-away")\n')
    g = Graph()
    x = g.input("x", (4, 8))
    y = g.input("y", (4, 8))
    g.set_outputs([g.narrow(x, axis=1, start=0, length=4), g.max(y, g.scalar(0.0))])  # both build a Relu
    with pytest.raises(UnsoundRewrite) as err:
        optimize_with_report(g, rules=[default_rule_dir(), path], strict=True)
    assert str(err.value) == (f"unsound rewrite: a Relu e-node has type f32[4, 8] but its e-class has type f32[4, 4]; "
                              f"built by rule(s): narrow-away ({path}:6)")


def test_decoded_nodes_carry_their_builders_and_blame_adds_the_mergers(tmp_path):
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.neg(g.relu(g.relu(g.mul(x, g.sigmoid(x)))))])  # nodes: x, Sigmoid, Mul, Relu, Relu, Neg
    _, view, _ = saturated(g, None)
    cpu = get_target("cpu")
    chosen = ex.greedy(view, [view.class_of_node[o] for o in g.outputs], cpu,
                       {n.id: k for k, n in enumerate(g.nodes)}, ex.node_costs(view, cpu))
    decoded = decode(view, chosen.choice, g)
    assert [n.op for n in decoded.graph.nodes] == ["Input", "Silu", "Relu", "Neg"]
    assert [decoded.built_by[n.id] for n in decoded.graph.nodes] == [(), ("silu-mul-sigmoid",), (), ()]
    assert [decoded.merged_by[n.id] for n in decoded.graph.nodes] == [(), ("silu-mul-sigmoid",), ("relu-relu",), ()]
    rules_of = blame(decoded)
    assert [rules_of(n.id) for n in decoded.graph.nodes] == [[], ["silu-mul-sigmoid"], ["relu-relu"], []]


def test_provenance_tables_are_not_counted_as_enodes():
    g = examples.llama(layers=1)
    egraph, view, result = saturated(g, None)
    sizes = dict(egraph.run_program(eb.PrintSize(eb.PanicSpan(), None))[0].sizes)
    assert sizes["merged-by"] > 0 and sizes["built-FusedSwiGLU"] > 0
    lists_and_absent = sum(sizes.get(name, 0) for name in (LIST_CONS, LIST_NIL, NO_INPUT))
    assert result.history[-1].enodes == view.num_enodes + lists_and_absent


def test_shipped_rule_fusions_on_llama_name_exactly_the_rules_that_built_them():
    _, report = optimize_with_report(examples.llama(layers=2), verify=True)
    # the shared-input chain narrows its wide matmul step by step; narrow-narrow flattens the later slices
    layer = [("ConcatParams", ("shared-input-matmul",)), ("FusedRmsNormMatMul", ("rms-norm-matmul",)),
             ("Narrow", ("shared-input-matmul",)), ("Narrow", ("narrow-narrow",)),
             ("Narrow", ("narrow-narrow",)), ("CausalAttentionRoPE", ("causal-attention-rope",)),
             ("FusedMatMulAdd", ("matmul-add",)), ("ConcatParams", ("shared-input-matmul",)),
             ("FusedRmsNormMatMul", ("rms-norm-matmul",)), ("FusedSwiGLU", ("fused-swiglu-gate-first",)),
             ("FusedMatMulAdd", ("matmul-add",))]
    assert [(f.op, f.rules) for f in report.fusions] == [*layer, *layer, ("FusedRmsNormMatMul", ("rms-norm-matmul",))]
    assert report.parity.ok

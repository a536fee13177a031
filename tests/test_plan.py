"""The LIR memory plan: steps and phases, views, offsets, liveness, the manifest, the fingerprint, the
static checker and the arena runner (bit for bit equal to ``evaluate`` on random graphs)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.memory_plan import main as bench_main
from rlx_egraph import Graph, evaluate, examples
from rlx_egraph.compile import plan as plan_module
from rlx_egraph.compile.plan import Phase, PlanError, Section, plan_memory, reshape_strides

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def assert_bit_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"output {k}"
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"output {k}: {a} != {b}"


def chain() -> Graph:
    """x -> Relu -> Tanh -> Neg -> Sigmoid: at most two [64, 64] f32 values live at once."""
    g = Graph("chain")
    v = g.input("x", (64, 64))
    for op in ("Relu", "Tanh", "Neg", "Sigmoid"):
        v = g.add_node(op, [v])
    g.set_outputs([v])
    return g


# --- steps, phases, sections ------------------------------------------------------------------------


def test_chain_plan_steps_sections_and_bounds():
    plan = plan_memory(chain())
    assert [(s.index, s.phase.value, s.action, s.node) for s in plan.steps] == [
        (0, "prologue", "feed", 0), (1, "body", "kernel", 1), (2, "body", "kernel", 2), (3, "body", "kernel", 3),
        (4, "body", "kernel", 4), (5, "epilogue", "read", 4)]
    size = 64 * 64 * 4
    assert dict(plan.sections) == {Section.WEIGHTS: (0, 0), Section.INPUTS: (0, size), Section.OUTPUTS: (size, size),
                                   Section.SCRATCH: (2 * size, 2 * size)}
    scratch = [(b.node, b.offset, b.first, b.last) for b in plan.buffers if b.section is Section.SCRATCH]
    assert scratch == [(1, 2 * size, 1, 2), (2, 3 * size, 2, 3), (3, 2 * size, 3, 4)]  # node 3 reuses node 1's bytes
    assert (plan.arena_bytes, plan.lower_bound_bytes, plan.no_reuse_bytes) == (4 * size, 4 * size, 5 * size)
    assert plan.phase_of(0) is Phase.PROLOGUE and plan.phase_of(4) is Phase.BODY
    plan.check()


def test_phases_hold_inputs_weights_and_outputs():
    g = Graph("phases")
    x = g.input("x", (2, 8))
    w1, w2 = g.param("w1", (8, 4)), g.param("w2", (8, 4))
    cat = g.concat_params([w1, w2], axis=-1)
    s = g.scalar(2.0)
    y = g.mul(g.matmul(x, cat), s)
    flat = g.reshape(y, shape=(16,))
    g.set_outputs([y, flat, x, w1])
    plan = plan_memory(g)
    assert [(s.phase.value, s.action, s.node) for s in plan.steps] == [
        ("prologue", "feed", x), ("prologue", "prepare", cat), ("prologue", "load", s),
        ("body", "kernel", 5), ("body", "kernel", y), ("epilogue", "read", y), ("epilogue", "copy", flat),
        ("epilogue", "copy", x), ("epilogue", "copy", w1)]  # w1 and w2 are slices of cat, flat a view of y
    assert [plan.phase_of(n) for n in (x, w1, w2, cat, s, 5, y, flat)] == [Phase.PROLOGUE] * 5 + [Phase.BODY] * 3
    assert [step.node for step in plan.phase(Phase.EPILOGUE)] == [y, flat, x, w1]
    sections = {b.node: b.section for b in plan.buffers if b.section is not Section.OUTPUTS}
    assert sections == {x: Section.INPUTS, cat: Section.WEIGHTS, s: Section.WEIGHTS, 5: Section.SCRATCH}
    assert sorted(b.node for b in plan.buffers if b.section is Section.OUTPUTS) == [x, w1, y, flat]
    plan.check()
    assert_bit_equal(plan.run(), evaluate(g))


# --- views ------------------------------------------------------------------------------------------


def test_layout_ops_are_views_of_their_root_where_the_strides_allow():
    g = Graph("views")
    x = g.input("x", (2, 3, 4))
    y = g.relu(x)
    t = g.transpose(y, perm=(2, 0, 1))
    n = g.narrow(y, axis=1, start=1, length=2)
    r = g.reshape(y, shape=(6, 4))
    row = g.narrow(y, axis=0, start=1, length=1)
    e = g.expand(row, shape=(5, 2, 3, 4))
    copy = g.reshape(t, shape=(24,))  # a transposed value is not row-major: this Reshape copies
    outputs = [g.add(g.sum_all(t), g.sum_all(n)), g.sum_all(r), g.sum_all(copy)]
    last_reader = g.sum_all(e)
    g.set_outputs([*outputs, last_reader])
    plan = plan_memory(g)
    views = {v.node: (v.root, v.offset, v.strides) for v in plan.views.values()}
    assert views == {t: (y, 0, (4, 48, 16)), n: (y, 16, (48, 16, 4)), r: (y, 0, (16, 4)),
                     row: (y, 48, (48, 16, 4)), e: (y, 48, (0, 0, 16, 4))}
    assert [(s.action, s.node) for s in plan.steps if s.node == copy] == [("copy", copy)]
    assert plan.buffer_of(t) is plan.buffer_of(y)
    step_of = {s.node: s.index for s in plan.steps if s.phase is Phase.BODY}
    assert plan.buffer_of(y).last == step_of[last_reader]
    plan.check()
    assert_bit_equal(plan.run(), evaluate(g))


def test_params_of_a_derived_weight_are_slices_of_it():
    g = Graph("derived")
    x = g.input("x", (3, 4))
    wa, wb = g.param("wa", (4, 2)), g.param("wb", (4, 3))
    rows_a, rows_b = g.param("ra", (1, 4)), g.param("rb", (2, 4))
    cols = g.concat_params([wa, wb], axis=-1)
    rows = g.concat_params([rows_a, rows_b], axis=0)
    g.set_outputs([g.matmul(x, cols), g.matmul(rows, wa)])  # wa is also read on its own
    plan = plan_memory(g)
    assert {n: (v.root, v.offset, v.strides) for n, v in plan.views.items()} == {
        wa: (cols, 0, (20, 4)), wb: (cols, 8, (20, 4)), rows_a: (rows, 0, (16, 4)), rows_b: (rows, 16, (16, 4))}
    params = {e.name: (e.offset, e.strides) for e in plan.io.params}
    base_cols, base_rows = plan.buffer_of(cols).offset, plan.buffer_of(rows).offset
    assert params == {"wa": (base_cols, (20, 4)), "wb": (base_cols + 8, (20, 4)), "ra": (base_rows, (16, 4)),
                      "rb": (base_rows + 16, (16, 4))}
    assert not any(s.node in (wa, wb, rows_a, rows_b) for s in plan.steps)  # loaded by preparing the derived weight
    plan.check()
    given = {"wa": np.arange(8.0).reshape(4, 2), "rb": -np.ones((2, 4))}
    assert_bit_equal(plan.run(params=given), evaluate(g, params=given))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_reshape_strides_follow_numpy(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    base = np.zeros(shape, np.float32)
    view = base.transpose(data.draw(st.permutations(range(len(shape)))))
    axis = data.draw(st.integers(0, len(shape) - 1))
    index = [slice(None)] * len(shape)
    index[axis] = slice(data.draw(st.integers(0, view.shape[axis] - 1)), None)
    view = view[tuple(index)]
    numel = view.size
    divisors = [d for d in range(1, numel + 1) if numel % d == 0]
    lead = data.draw(st.sampled_from(divisors))
    new_shape = data.draw(st.sampled_from([(numel,), (lead, numel // lead), (1, numel, 1), (lead, 1, numel // lead)]))
    got = reshape_strides(view.shape, view.strides, new_shape, 4)
    reshaped = view.reshape(new_shape)
    if np.shares_memory(reshaped, view):
        assert got is not None
        assert all(a == b for a, b, d in zip(got, reshaped.strides, new_shape, strict=True) if d != 1)
    else:
        assert got is None


# --- alignment, fingerprint, manifest ----------------------------------------------------------------


@pytest.mark.parametrize("alignment", [64, 256, 1])
def test_every_offset_is_aligned(alignment):
    g = examples.gpt2(layers=1)
    plan = plan_memory(g, alignment=alignment)
    assert plan.alignment == alignment
    assert all(b.offset % alignment == 0 for b in plan.buffers)
    assert all(base % alignment == 0 for base, _ in plan.sections.values())
    assert plan.arena_bytes >= plan.lower_bound_bytes
    plan.check()


def test_alignment_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="alignment must be a power of two, got 48"):
        plan_memory(chain(), alignment=48)


def test_io_manifest_names_shapes_dtypes_and_offsets():
    g = examples.bert(layers=1)
    plan = plan_memory(g)
    assert [(e.name, e.shape, e.dtype) for e in plan.io.inputs] == [("input_ids", (2, 8), "i64"),
                                                                    ("attention_mask", (2, 8), "f32")]
    assert [(e.name, e.node, e.shape, e.dtype) for e in plan.io.outputs] == [("output0", g.outputs[0], (2, 8, 64),
                                                                             "f32")]
    assert [e.name for e in plan.io.params] == [p.name for p in g.params]
    assert [e.strides for e in plan.io.inputs] == [(64, 8), (32, 4)]
    for e in plan.io.inputs + plan.io.params:
        assert e.offset == plan.buffer_of(e.node).offset
    out = plan.io.outputs[0]
    assert out.offset == plan.output_buffer(out.node).offset and out.strides == (2048, 256, 4)
    assert plan.sections[Section.INPUTS][0] <= plan.io.inputs[0].offset < plan.sections[Section.OUTPUTS][0]


FINGERPRINT = ("from rlx_egraph import examples; from rlx_egraph.compile.plan import plan_memory; "
               "print(plan_memory(examples.llama(layers=1)).fingerprint())")


def test_fingerprint_is_stable_across_processes_and_tracks_the_plan():
    here = plan_memory(examples.llama(layers=1)).fingerprint()
    src = str(Path(__file__).resolve().parents[1] / "src")
    other = subprocess.run([sys.executable, "-c", FINGERPRINT], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": src, "PYTHONHASHSEED": "123"}).stdout.strip()
    assert other == here and len(here) == 64
    assert plan_memory(examples.llama(layers=1), alignment=128).fingerprint() != here
    assert plan_memory(examples.llama(layers=1, seq=8)).fingerprint() != here
    assert plan_memory(examples.llama(layers=1), target="cuda").fingerprint() != here
    data = json.loads(json.dumps(plan_memory(chain()).to_dict()))
    assert data["format"] == "rlx-egraph-lir" and data["steps"][0] == [0, "prologue", "feed", 0]


# --- the checker and the runner catch broken plans ----------------------------------------------------------


def _with_buffer(plan, node, **changes):
    buffers = tuple(dataclasses.replace(b, **changes) if b.node == node and b.section is Section.SCRATCH else b
                    for b in plan.buffers)
    return dataclasses.replace(plan, buffers=buffers)


def test_a_buffer_placed_over_a_live_one_is_caught():
    g = Graph("diamond")
    a = g.relu(g.input("x", (8, 8)))
    b = g.tanh(a)
    g.set_outputs([g.add(g.neg(b), a)])  # a is read again after b is written
    plan = plan_memory(g)
    broken = _with_buffer(plan, b, offset=plan.buffer_of(a).offset)
    with pytest.raises(PlanError, match=r"buffers of node 1 and node 2 share bytes while both are live "
                                        r"\(steps 1..4 and 2..3\)"):
        broken.check()
    x = {"x": np.linspace(0.5, 1.0, 64).reshape(8, 8)}
    assert_bit_equal(plan.run(x), evaluate(g, x))
    assert (plan.run(x)[0] > 0.03).all()
    assert np.isnan(broken.run(x)[0]).all()  # the shared bytes held b, poisoned after its last read at step 3


def test_a_buffer_reused_too_early_is_caught():
    g = chain()
    plan = plan_memory(g)
    broken = _with_buffer(plan, 2, last=2)  # node 2 is read at step 3
    with pytest.raises(PlanError, match=r"step 3 \(kernel node 3\) reads node 2 outside its buffer's liveness 2..2"):
        broken.check()
    got = broken.run()[0]  # its bytes are poisoned after step 2
    assert np.isnan(got).all()


def test_a_wrong_view_offset_is_caught_by_the_runner():
    g = Graph("narrow")
    y = g.relu(g.input("x", (4, 4)))
    n = g.narrow(y, axis=0, start=2, length=2)
    g.set_outputs([g.neg(n)])
    plan = plan_memory(g)
    wrong = dataclasses.replace(plan, views={n: dataclasses.replace(plan.views[n], offset=0)})
    wrong.check()  # still inside its root: only running shows it
    with pytest.raises(PlanError, match=r"view node 2 \(Narrow\) at offset 0 strides \[16, 4\] of node 1's buffer "
                                        r"does not hold the value of the layout op"):
        wrong.run()
    past = dataclasses.replace(plan, views={n: dataclasses.replace(plan.views[n], offset=48)})
    with pytest.raises(PlanError, match=r"view node 2 \(Narrow\) reads bytes \[48, 80\) of node 1's 64-byte buffer"):
        past.check()


def test_a_misaligned_or_out_of_section_buffer_is_caught():
    plan = plan_memory(chain())
    with pytest.raises(PlanError, match="buffer 2 \\(node 1\\) at offset 32776 is not aligned to 64"):
        _with_buffer(plan, 1, offset=plan.buffer_of(1).offset + 8).check()
    with pytest.raises(PlanError, match=r"runs outside the scratch section \[32768, 65536\)"):
        _with_buffer(plan, 1, offset=plan.arena_bytes).check()
    outputs = [k for k, b in enumerate(plan.buffers) if b.section is Section.OUTPUTS]
    over_input = dataclasses.replace(plan, buffers=tuple(dataclasses.replace(b, offset=0) if k in outputs else b
                                                         for k, b in enumerate(plan.buffers)),
                                     sections={**plan.sections, Section.OUTPUTS: (0, 16384)})
    with pytest.raises(PlanError, match=r"the outputs section \[0, 16384\) does not follow the previous section, "
                                        r"which ends at 16384"):
        over_input.check()
    g = Graph("two inputs")
    a, b = g.input("a", (4,)), g.input("b", (4,))
    g.set_outputs([g.add(a, b)])
    plan = plan_memory(g)
    same = tuple(dataclasses.replace(x, offset=0) if x.node == b else x for x in plan.buffers)
    with pytest.raises(PlanError, match=r"buffers of node 0 and node 1 share bytes while both are live "
                                        r"\(steps 0..3 and 1..3\)"):
        dataclasses.replace(plan, buffers=same).check()


# --- the runner equals evaluate on random graphs ------------------------------------------------------------

FLOATS = ("f32", "f16", "bf16")
# Transposes and reductions twice, and the two in a row: a reduction of a value computed from a transposed
# view is where the layout a kernel sees changes its result.
KINDS = ("unary", "binary", "transpose", "transpose", "narrow", "reshape", "expand", "reduce", "reduce", "softmax",
         "matmul", "concat", "cast", "identity", "where", "derived", "reduce_transposed")


@st.composite
def random_graphs(draw: st.DrawFn) -> Graph:
    """Graphs mixing views (Transpose, Narrow, Reshape, Expand), copies, elementwise ops, reductions (whose
    summation order depends on the layout), matmuls, casts, derived weights and outputs of every kind."""
    g = Graph("random")
    dt = draw(st.sampled_from(("f32", "f32", "f32", "f16", "bf16")))  # f16/bf16 rounding hides layout effects
    shape = tuple(draw(st.lists(st.sampled_from((1, 2, 3, 5, 8, 16, 33)), min_size=2, max_size=3)))
    values = [g.input("x0", shape, dt)]

    def pick() -> int:
        """An earlier value of rank >= 1 (a reduction may give rank 0), the latest one half the time."""
        ranked = [v for v in values if g.node(v).shape]
        return ranked[-1] if draw(st.booleans()) else draw(st.sampled_from(ranked))

    for k in range(draw(st.integers(1, 14))):
        v = pick()
        node = g.node(v)
        rank = len(node.shape)
        kind = draw(st.sampled_from(KINDS))
        is_float = node.dtype in FLOATS
        if kind == "unary":
            ops = ["Relu", "Tanh", "Neg", "Sigmoid", "Abs"] if is_float else ["Neg", "Abs"]
            values.append(g.add_node(draw(st.sampled_from(ops)), [v]))
        elif kind == "binary":
            other = g.input(f"x{k + 1}", node.shape[draw(st.integers(0, rank)):], node.dtype) \
                if draw(st.booleans()) else v
            values.append(g.add_node(draw(st.sampled_from(["Add", "Mul", "Sub", "Max"])), [v, other]))
        elif kind == "transpose" and rank >= 2:
            values.append(g.transpose(v, perm=tuple(draw(st.permutations(range(rank))))))
        elif kind == "narrow":
            axis = draw(st.integers(0, rank - 1))
            start = draw(st.integers(0, node.shape[axis] - 1))
            length = draw(st.integers(1, node.shape[axis] - start))
            values.append(g.narrow(v, axis=axis, start=start, length=length))
        elif kind == "reshape":
            numel = math.prod(node.shape)
            values.append(g.reshape(v, shape=draw(st.sampled_from([(numel,), (node.shape[0], -1), (1, numel)]))))
        elif kind == "expand":
            values.append(g.expand(v, shape=(2, *(d if d != 1 else 3 for d in node.shape))))
        elif kind == "reduce":
            axes = tuple(draw(st.sets(st.integers(0, rank - 1), min_size=1)))
            op = draw(st.sampled_from(["ReduceSum", "ReduceMean"]))
            values.append(g.add_node(op, [v], axes=axes, keepdims=draw(st.booleans())))
        elif kind == "softmax" and is_float:
            values.append(g.softmax(v, axis=draw(st.integers(0, rank - 1))))
        elif kind == "matmul" and rank >= 2 and is_float:
            values.append(g.matmul(v, g.param(f"w{k}", (node.shape[-1], 3), node.dtype)))
        elif kind == "concat":
            values.append(g.concat([v, v], axis=draw(st.integers(0, rank - 1))))
        elif kind == "cast":
            values.append(g.cast(v, dtype=draw(st.sampled_from([*FLOATS, "i64", "i32"]))))
        elif kind == "identity":
            values.append(g.identity(v))
        elif kind == "where":
            cond = g.greater(v, g.scalar(0.0, node.dtype))
            values.append(g.where(cond, v, g.neg(v)))
        elif kind == "reduce_transposed" and rank >= 2:
            moved = g.relu(g.transpose(v, perm=tuple(draw(st.permutations(range(rank)))))) if is_float \
                else g.neg(g.transpose(v, perm=tuple(reversed(range(rank)))))
            values.append(g.reduce_sum(moved, axes=(draw(st.integers(0, rank - 1)),)))
        elif kind == "derived" and rank >= 2 and is_float:
            parts = [g.param(f"d{k}_{j}", (node.shape[-1], j + 1), node.dtype) for j in range(2)]
            values.append(g.matmul(v, g.concat_params(parts, axis=-1)))
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    g.set_outputs(outputs)
    return g


@SETTINGS
@given(random_graphs(), st.integers(0, 3))
def test_runner_matches_evaluate_bit_for_bit_on_random_graphs(g, seed):
    plan = plan_memory(g)
    plan.check()
    assert_bit_equal(plan.run(seed=seed), evaluate(g, seed=seed))
    assert plan.arena_bytes <= plan.no_reuse_bytes
    assert plan.lower_bound_bytes <= plan.arena_bytes


def test_kernels_see_their_inputs_in_the_layout_evaluate_gives_them():
    # Relu of a transposed view comes out column-major in numpy, and numpy sums a column-major array in
    # another order than a row-major one: the arena holds it row-major, the runner hands it over as produced.
    g = Graph("layout")
    x = g.input("x", (16, 16))
    g.set_outputs([g.reduce_sum(g.relu(g.transpose(x, perm=(1, 0))), axes=(1,))])
    plan = plan_memory(g)
    want = evaluate(g)
    row_major = np.sum(np.ascontiguousarray(np.maximum(evaluate(g, return_all=True)[2], 0)), axis=1)
    assert row_major.tobytes() != want[0].tobytes()  # the layout matters for this data
    assert_bit_equal(plan.run(), want)


@pytest.mark.parametrize("build", [examples.mlp, examples.llama, examples.bert, examples.gpt2, examples.conv_block])
def test_runner_matches_evaluate_on_the_example_models(build):
    g = build()
    plan = plan_memory(g)
    plan.check()
    assert_bit_equal(plan.run(seed=1), evaluate(g, seed=1))
    assert plan.arena_bytes == plan.lower_bound_bytes


# --- placement ------------------------------------------------------------------------------------------


def test_squeaky_wheel_rounds_reach_the_lower_bound_where_greedy_by_size_does_not(monkeypatch):
    g = examples.synthetic(300)
    plan = plan_memory(g)
    assert plan.scratch_bytes == plan.scratch_lower_bound_bytes == 18432
    monkeypatch.setattr(plan_module, "PLACEMENT_ROUNDS", 1)  # TFLite's greedy by size alone
    assert plan_memory(g).scratch_bytes == 20480


def test_benchmark_prints_the_arena_table(capsys):
    assert bench_main(["--quick", "--models", "mlp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["case", "graph", "nodes", "steps"]
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("mlp", "layers=1", "optimized"), ("mlp", "layers=1", "as-built"),
                                                  ("mlp", "layers=8", "optimized"), ("mlp", "layers=8", "as-built")]
    assert [(r[9], r[12]) for r in rows] == [("0.00", "0.00")] * 4  # arena and scratch over their lower bounds

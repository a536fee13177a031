"""The region kinds: ops whose ``chain`` attribute is a program of steps run as one kernel, made by the region
passes after extraction (docs/regions.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..registry import (
    REGISTRY,
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OpSpec,
    ShapeError,
    Shapes,
    TensorType,
    at_least_one,
    op_spec,
    pick,
    random_shape,
    register,
    short_repr,
)
from . import reference as K

if TYPE_CHECKING:
    from ..graph import Graph

T = TensorType
INT, S = AttrType.INT, AttrType.STR


# The region kinds: ops whose ``chain`` attribute is a program of steps run as one kernel.
ELEMENTWISE_REGION, TRANSFORM_REGION, BATCH_REGION = "ElementwiseRegion", "TransformRegion", "BatchElementwiseRegion"


REGION_KINDS = (ELEMENTWISE_REGION, TRANSFORM_REGION, BATCH_REGION)


# What an ElementwiseRegion may do to its input 0 before its steps: nothing, or a nearest-neighbour 2x upsample.
PROLOGUES = ("none", "upsample2x")


# The layout steps a TransformRegion runs between its elementwise steps: each moves every element once.
TRANSFORM_STEPS = frozenset({"Transpose", "Reshape"})


@dataclass(frozen=True)
class RegionStep:
    """One step of a region's chain, resolved by its op's shape rule."""

    spec: OpSpec
    attrs: dict[str, Any]
    operands: tuple[int, ...]  # i >= 0: region input i; -k: the value of step k-1
    type: T


def _parse_chain(a: Attrs) -> tuple[list[str] | None, list]:
    """The chain's declared input dtypes (None in the list shorthand) and its raw steps."""
    try:
        chain = json.loads(a["chain"])
    except ValueError as exc:
        raise ShapeError(f"chain is not JSON: {exc}") from None
    except RecursionError:
        raise ShapeError("chain is nested too deeply to read") from None
    if isinstance(chain, list):
        return None, chain
    if isinstance(chain, dict) and chain.keys() == {"inputs", "steps"} and isinstance(chain["inputs"], list) \
            and isinstance(chain["steps"], list):
        return chain["inputs"], chain["steps"]
    raise ShapeError('chain must be {"inputs": [dtype, ...], "steps": [[op, attrs, operands], ...]} '
                     "or the list of steps alone")


def _step_ops(transform: bool) -> str:
    return "an elementwise or transform (Transpose, Reshape) op" if transform else "an elementwise op"


def region_program(a: Attrs, ins: list[T], transform: bool = False) -> list[RegionStep]:
    """Check a region's chain over inputs of types ``ins`` step by step and type every step.

    The chain is ``{"inputs": [dtype, ...], "steps": [[op, attrs, operands], ...]}``; operand
    i >= 0 is region input i, -k the value of step k-1.  ``"inputs"`` (the inputs' dtypes, which
    the kernel cannot see in its compute-typed arrays) may be left out and must match ``ins``.
    A ``prologue`` of ``upsample2x`` gives the steps input 0 upsampled (Upsample2x); ``transform``
    (TransformRegion) also admits the layout steps :data:`TRANSFORM_STEPS`.
    """
    declared, steps = _parse_chain(a)
    if declared is not None and declared != [t.dtype for t in ins]:
        raise ShapeError(f"chain inputs are {declared}, the region's inputs are {[t.dtype for t in ins]}")
    if not steps:
        raise ShapeError("chain must have at least one step")
    if a.get("prologue", "none") != "none":
        if not ins:
            raise ShapeError("a prologue needs an input 0")
        try:
            ins = [op_spec("Upsample2x").infer({}, [ins[0]]), *ins[1:]]
        except ShapeError as exc:
            raise ShapeError(f"prologue {a['prologue']}: {exc}") from None
    program: list[RegionStep] = []
    for k, step in enumerate(steps):
        if not (isinstance(step, list) and len(step) == 3 and isinstance(step[1], dict)
                and isinstance(step[2], list)):
            raise ShapeError(f"chain step {k} is not [op, attrs, operands]: {short_repr(step)}")
        op, attrs, operands = step
        spec = REGISTRY.get(op) if isinstance(op, str) else None
        if spec is None or not (spec.kind is Kind.ELEMENTWISE or (transform and op in TRANSFORM_STEPS)):
            raise ShapeError(f"chain step {k} op {short_repr(op)} is not {_step_ops(transform)}")
        if not all(type(i) is int and -k <= i < len(ins) for i in operands):
            raise ShapeError(f"chain step {k} refers to a missing operand in {short_repr(operands)}")
        try:
            resolved, out = spec.resolve(attrs, [ins[i] if i >= 0 else program[-i - 1].type for i in operands])
        except ShapeError as exc:
            raise ShapeError(f"chain step {k} ({op}): {exc}") from None
        program.append(RegionStep(spec, resolved, tuple(operands), out))
    return program


def _canonical_chain(a: Attrs, ins: list[T], transform: bool) -> str:
    """The chain with the inputs' dtypes and every step's attributes filled in."""
    steps = [[s.spec.name, {key: list(v) if isinstance(v, tuple) else v for key, v in s.attrs.items()},
              list(s.operands)] for s in region_program(a, ins, transform)]
    return json.dumps({"inputs": [t.dtype for t in ins], "steps": steps})


def _run_program(a: Attrs, xs: tuple[np.ndarray, ...], transform: bool) -> np.ndarray:
    """Run every step as the interpreter runs the node it replaces: in and out of that step's dtype."""
    declared, _ = _parse_chain(a)
    if declared is None:
        raise ShapeError("the kernel needs a resolved chain (with its inputs' dtypes)")
    program = region_program(a, [T(x.shape, d) for x, d in zip(xs, declared, strict=True)], transform)
    if a.get("prologue", "none") == "upsample2x":
        xs = (K.upsample2x({}, xs[0]), *xs[1:])
    values: list[np.ndarray] = []
    for step in program:
        args = [xs[i] if i >= 0 else values[-i - 1] for i in step.operands]
        dtypes = [declared[i] if i >= 0 else program[-i - 1].type.dtype for i in step.operands]
        values.append(K.run_node(step.spec, step.attrs, args, dtypes, step.type))
    return values[-1]


def _build_program(g: Graph, ins: list[int], a: Attrs, transform: bool) -> int:
    """One node per step (after an Upsample2x of input 0 for the prologue)."""
    if a.get("prologue", "none") == "upsample2x":
        ins = [g.upsample2x(ins[0]), *ins[1:]]
        a = {**a, "prologue": "none"}
    results: list[int] = []
    for step in region_program(a, [g.node(i).type for i in ins], transform):
        inputs = [ins[i] if i >= 0 else results[-i - 1] for i in step.operands]
        results.append(g.add_node(step.spec.name, inputs, **step.attrs))
    return results[-1]


def _program_flops(a: Attrs, ins: list[T], out: T) -> int:
    return out.numel * len(_parse_chain(a)[1])


def _chain_region(name: str, transform: bool, attrs: tuple[AttrSpec, ...], doc: str,
                  sampler: Any) -> OpSpec:
    """A region op running its chain (ElementwiseRegion, TransformRegion): one kernel, each step stored in its
    own dtype, decomposed into one node per step."""
    return OpSpec(name, Kind.FUSED, ("xs*",), lambda a, ins: region_program(a, ins, transform)[-1].type,
                  lambda a, *xs: _run_program(a, xs, transform), (AttrSpec("chain", AttrType.JSON), *attrs),
                  flops=_program_flops,
                  canonical=lambda a, ins: {**a, "chain": _canonical_chain(a, ins, transform)}, doc=doc,
                  decompose=lambda g, ins, a: _build_program(g, ins, a, transform), sampler=sampler)


def _lanes(a: Attrs, ins: list[T]) -> list[list[T]]:
    """A batched region's inputs, lane by lane (``lanes`` lanes of equal input types)."""
    k = a["lanes"]
    if len(ins) % k:
        raise ShapeError(f"{len(ins)} inputs do not split into {k} lanes")
    m = len(ins) // k
    lanes = [ins[j * m:(j + 1) * m] for j in range(k)]
    if any(lane != lanes[0] for lane in lanes):
        raise ShapeError(f"every lane must read inputs of the types {[str(t) for t in lanes[0]]}, got "
                         f"{[[str(t) for t in lane] for lane in lanes]}")
    return lanes


def _batch_infer(a: Attrs, ins: list[T]) -> T:
    out = region_program(a, _lanes(a, ins)[0])[-1].type
    return T((a["lanes"], *out.shape), out.dtype)


def _batch_kernel(a: Attrs, *xs: np.ndarray) -> np.ndarray:
    m = len(xs) // a["lanes"]
    return np.stack([_run_program(a, xs[j * m:(j + 1) * m], False) for j in range(a["lanes"])])


def _batch_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Each lane's steps, its result given a leading axis, the lanes concatenated along it."""
    m = len(ins) // a["lanes"]
    outs = [_build_program(g, ins[j * m:(j + 1) * m], a, False) for j in range(a["lanes"])]
    return g.concat([g.reshape(o, shape=(1, *g.node(o).shape)) for o in outs], axis=0)


# Steps a sampled region draws from: finite on every finite input (Exp, Log, Div, Pow, ... overflow or
# leave their domain), so every sample has a value to compare.
_REGION_UNARY: tuple[tuple[str, dict[str, str]], ...] = (
    ("Relu", {}), ("Silu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Neg", {}), ("Abs", {}), ("Erf", {}), ("Identity", {}),
    ("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"}),
)


_REGION_BINARY = ("Add", "Sub", "Mul", "Max", "Min")


def _random_steps(rng: np.random.Generator, chain: list[list[Any]], values: list[int], steps: int) -> None:
    """Append ``steps`` random unary, binary or select (Where(Greater(p, q), p, r)) steps over ``values`` (the float
    operands of one shape so far: inputs i >= 0, step results -(step + 1)) to ``chain``."""
    for _ in range(steps):
        kind = pick(rng, ["unary", "binary", "select"])
        if kind == "unary":
            op, attrs = pick(rng, _REGION_UNARY)
            chain.append([op, attrs, [pick(rng, values)]])
        elif kind == "binary":
            chain.append([pick(rng, _REGION_BINARY), {}, [pick(rng, values), pick(rng, values)]])
        else:
            p, q, r = (pick(rng, values) for _ in range(3))
            chain.append(["Greater", {}, [p, q]])
            chain.append(["Where", {}, [-len(chain), p, r]])
        values.append(-len(chain))


def _region_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``shape`` and 0 to 2 trailing parts of it: a region's inputs."""
    return [shape, *(shape[int(rng.integers(0, len(shape))):] for _ in range(int(rng.integers(0, 3))))]


def _region_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """1 to 6 random steps over 1 to 3 inputs (the region's shape and trailing parts of it); one time in three
    input 0 is read through the upsample prologue (then 4-D, at half the region's height and width)."""
    prologue = pick(rng, ["none", "none", "upsample2x"])
    shape = (*random_shape(rng, 2, 2), *(2 * d for d in random_shape(rng, 2, 2))) if prologue != "none" \
        else random_shape(rng, 2, 3)
    xs = _region_inputs(rng, shape)
    chain: list[list[Any]] = []
    _random_steps(rng, chain, list(range(len(xs))), int(rng.integers(1, 7)))
    if prologue != "none":
        xs[0] = (*shape[:2], shape[2] // 2, shape[3] // 2)
    return {"xs": xs}, {"chain": json.dumps(chain), "prologue": prologue}


def _transform_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """Random steps on x, a Transpose or Reshape of their value, random steps on that and on inputs of its shape."""
    shape = random_shape(rng, 2, 3)
    chain: list[list[Any]] = []
    _random_steps(rng, chain, [0], int(rng.integers(1, 4)))
    if rng.random() < 0.5:
        perm = tuple(int(p) for p in rng.permutation(len(shape)))
        chain.append(["Transpose", {"perm": list(perm)}, [-len(chain)]])
        moved = tuple(shape[p] for p in perm)
    else:
        moved = (int(np.prod(shape)),)
        chain.append(["Reshape", {"shape": list(moved)}, [-len(chain)]])
    xs = [shape, *_region_inputs(rng, moved)]
    _random_steps(rng, chain, [-len(chain), *range(1, len(xs))], int(rng.integers(1, 4)))
    return {"xs": xs}, {"chain": json.dumps(chain)}


def _batch_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """2 or 3 lanes of one sampled region program (no prologue)."""
    shape = random_shape(rng, 2, 3)
    lane = _region_inputs(rng, shape)
    chain: list[list[Any]] = []
    _random_steps(rng, chain, list(range(len(lane))), int(rng.integers(1, 5)))
    lanes = int(rng.integers(2, 4))
    return {"xs": lane * lanes}, {"chain": json.dumps(chain), "lanes": lanes}


REGIONS = [
    _chain_region(ELEMENTWISE_REGION, False, (AttrSpec("prologue", S, "none", choices=PROLOGUES),),
                  "A chain of elementwise ops run as one kernel, each step stored in its own dtype; with the "
                  "upsample2x prologue the kernel reads input 0 through a nearest-neighbour 2x upsample.",
                  _region_sample),
    _chain_region(TRANSFORM_REGION, True, (),
                  "A chain of elementwise ops with Transposes and Reshapes between them run as one kernel (each "
                  "step computed in its own shape, stored in its own dtype).", _transform_sample),
    OpSpec(BATCH_REGION, Kind.FUSED, ("xs*",), _batch_infer, _batch_kernel,
           (AttrSpec("chain", AttrType.JSON), AttrSpec("lanes", INT, check=at_least_one)), flops=_program_flops,
           canonical=lambda a, ins: {**a, "chain": _canonical_chain(a, _lanes(a, ins)[0], False)},
           doc="One elementwise chain run on several independent lanes of inputs in one kernel: the lanes' results "
               "stacked along a new leading axis.", decompose=_batch_decompose, sampler=_batch_sample),
]
register(*REGIONS)

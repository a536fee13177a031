"""Fused ops (FUSIONS.md section 3).  Each kernel computes exactly what the
unfused subgraph it replaces computes; tests/test_fused_kernels.py proves it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...kernels import reference as K
from ..registry import (
    REGISTRY,
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OpSpec,
    ShapeError,
    TensorType,
    at_least_one,
    non_negative,
    op_spec,
    positive,
    register,
)
from ..shapes import broadcast, matmul_shape, norm_param_check, require_rank, same_dtype
from .primitives import attention_flops, causal_canonical, concat_infer, matmul_flops, norm_infer

T = TensorType
INT, F, B, S = AttrType.INT, AttrType.FLOAT, AttrType.BOOL, AttrType.STR

_EPS = AttrSpec("eps", F, 1e-5, check=positive)
_AXIS = AttrSpec("axis", INT, -1)
_SCALE = AttrSpec("scale", F, check=positive)
EPILOGUES = ("none", "gelu", "gelu_tanh", "silu")


def _matmul_add(name: str, k_a: int, k_b: int) -> OpSpec:
    mm = {"FusedMatMulAdd": K.matmul, "FusedMatMulATAdd": K.matmul_at, "FusedMatMulBTAdd": K.matmul_bt}[name]

    def infer(a: Attrs, ins: list[T]) -> T:
        dt = same_dtype(ins, f"{name} operands")
        return T(broadcast(matmul_shape(ins[0].shape, ins[1].shape, k_a, k_b, name), ins[2].shape), dt)

    return OpSpec(name, Kind.FUSED, ("a", "b", "d"), infer, lambda at, x, w, d: mm(at, x, w) + d,
                  flops=matmul_flops, doc=f"{name.removeprefix('Fused').removesuffix('Add')}(a, b) + d in one kernel.")


def _bias_act_infer(a: Attrs, ins: list[T]) -> T:
    x, w, bias = ins
    dt = same_dtype(ins, "FusedMatMulBiasAct operands")
    if bias.rank > 1:
        raise ShapeError(f"bias must have rank <= 1, got {list(bias.shape)}")
    return T(broadcast(matmul_shape(x.shape, w.shape, -1, -2, "FusedMatMulBiasAct"), bias.shape), dt)


def _rms_matmul_infer(a: Attrs, ins: list[T]) -> T:
    x, w_norm, w_proj = ins
    norm_param_check(x, w_norm, a["axis"], "FusedRmsNormMatMul w_norm")
    return T(matmul_shape(x.shape, w_proj.shape, -1, -2, "FusedRmsNormMatMul"), same_dtype(ins, "operands"))


def _causal_rope_infer(a: Attrs, ins: list[T]) -> T:
    out = op_spec("CausalAttention").infer(a, ins)
    if ins[0].shape[-1] % 2:
        raise ShapeError(f"RoPE needs an even head dim, got {ins[0].shape[-1]}")
    return out


def _rms_matmul_flops(a: Attrs, ins: list[T], out: T) -> int:
    """The projection's matmul plus the norm's few passes over x."""
    return 2 * out.numel * ins[0].shape[-1] + 4 * ins[0].numel


def _swiglu_infer(a: Attrs, ins: list[T]) -> T:
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"SwiGLU gate {list(ins[0].shape)} and up {list(ins[1].shape)} differ")
    return T(ins[0].shape, same_dtype(ins, "SwiGLU operands"))


def _fused_swiglu_infer(a: Attrs, ins: list[T]) -> T:
    cat = ins[0]
    if cat.rank < 1 or cat.shape[-1] % 2:
        raise ShapeError(f"FusedSwiGLU input must have an even last dim, got {list(cat.shape)}")
    return T((*cat.shape[:-1], cat.shape[-1] // 2), cat.dtype)


def _attention_block_infer(a: Attrs, ins: list[T]) -> T:
    hidden, qkv_w, out_w, mask, qkv_b, out_b = ins
    require_rank(hidden, 3, "FusedAttentionBlock hidden ([B, S, H])")
    h = hidden.shape[-1]
    expected = {"qkv_w": (h, 3 * h), "out_w": (h, h), "mask": hidden.shape[:2], "qkv_b": (3 * h,), "out_b": (h,)}
    for label, t in zip(expected, (qkv_w, out_w, mask, qkv_b, out_b), strict=True):
        if t.shape != expected[label]:
            raise ShapeError(f"FusedAttentionBlock {label} must be {list(expected[label])}, got {list(t.shape)}")
    same_dtype(ins, "FusedAttentionBlock inputs")
    if a["heads"] < 1 or h % a["heads"]:
        raise ShapeError(f"hidden width {h} is not divisible by heads={a['heads']}")
    return hidden


def _transformer_layer_infer(a: Attrs, ins: list[T]) -> T:
    hidden, qkv_w, qkv_b, out_w, out_b, ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b, mask = ins
    _attention_block_infer(a, [hidden, qkv_w, out_w, mask, qkv_b, out_b])
    h = hidden.shape[-1]
    inner = fc1_w.shape[-1]
    expected = {"ln1_g": (h,), "ln1_b": (h,), "fc1_w": (h, inner), "fc1_b": (inner,), "fc2_w": (inner, h),
                "fc2_b": (h,), "ln2_g": (h,), "ln2_b": (h,)}
    for label, t in zip(expected, (ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b), strict=True):
        if t.shape != expected[label]:
            raise ShapeError(f"FusedTransformerLayer {label} must be {list(expected[label])}, got {list(t.shape)}")
    return hidden


def _transformer_layer_flops(a: Attrs, ins: list[T], out: T) -> int:
    h, inner = ins[0].shape[-1], ins[7].shape[-1]
    tokens = ins[0].numel // h
    return 2 * tokens * h * (4 * h + 2 * inner) + 4 * out.numel * ins[0].shape[1]


@dataclass(frozen=True)
class RegionStep:
    """One step of an ElementwiseRegion chain, resolved by its op's shape rule."""

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
    if isinstance(chain, list):
        return None, chain
    if isinstance(chain, dict) and chain.keys() == {"inputs", "steps"} and isinstance(chain["inputs"], list) \
            and isinstance(chain["steps"], list):
        return chain["inputs"], chain["steps"]
    raise ShapeError('chain must be {"inputs": [dtype, ...], "steps": [[op, attrs, operands], ...]} '
                     "or the list of steps alone")


def region_program(a: Attrs, ins: list[T]) -> list[RegionStep]:
    """Check an ElementwiseRegion chain over inputs of types ``ins`` step by step and type every step.

    The chain is ``{"inputs": [dtype, ...], "steps": [[op, attrs, operands], ...]}``; operand
    i >= 0 is region input i, -k the value of step k-1.  ``"inputs"`` (the inputs' dtypes, which
    the kernel cannot see in its compute-typed arrays) may be left out and must match ``ins``.
    """
    declared, steps = _parse_chain(a)
    if declared is not None and declared != [t.dtype for t in ins]:
        raise ShapeError(f"chain inputs are {declared}, the region's inputs are {[t.dtype for t in ins]}")
    if not steps:
        raise ShapeError("chain must have at least one step")
    program: list[RegionStep] = []
    for k, step in enumerate(steps):
        if not (isinstance(step, list) and len(step) == 3 and isinstance(step[1], dict)
                and isinstance(step[2], list)):
            raise ShapeError(f"chain step {k} is not [op, attrs, operands]: {step!r}")
        op, attrs, operands = step
        spec = REGISTRY.get(op) if isinstance(op, str) else None
        if spec is None or spec.kind is not Kind.ELEMENTWISE:
            raise ShapeError(f"chain step {k} op {op!r} is not an elementwise op")
        if not all(type(i) is int and -k <= i < len(ins) for i in operands):
            raise ShapeError(f"chain step {k} refers to a missing operand in {operands}")
        try:
            resolved, out = spec.resolve(attrs, [ins[i] if i >= 0 else program[-i - 1].type for i in operands])
        except ShapeError as exc:
            raise ShapeError(f"chain step {k} ({op}): {exc}") from None
        program.append(RegionStep(spec, resolved, tuple(operands), out))
    return program


def _region_canonical(a: Attrs, ins: list[T]) -> dict:
    """The chain with the inputs' dtypes and every step's attributes filled in."""
    steps = [[s.spec.name, {key: list(v) if isinstance(v, tuple) else v for key, v in s.attrs.items()},
              list(s.operands)] for s in region_program(a, ins)]
    return {**a, "chain": json.dumps({"inputs": [t.dtype for t in ins], "steps": steps})}


def _region_infer(a: Attrs, ins: list[T]) -> T:
    return region_program(a, ins)[-1].type


def _region_kernel(a: Attrs, *xs: np.ndarray) -> np.ndarray:
    """Run every step as the interpreter runs the node it replaces: in and out of that step's dtype."""
    declared, _ = _parse_chain(a)
    if declared is None:
        raise ShapeError("the kernel needs a resolved chain (with its inputs' dtypes)")
    program = region_program(a, [T(x.shape, d) for x, d in zip(xs, declared, strict=True)])
    values: list[np.ndarray] = []
    for step in program:
        args = [xs[i] if i >= 0 else values[-i - 1] for i in step.operands]
        dtypes = [declared[i] if i >= 0 else program[-i - 1].type.dtype for i in step.operands]
        values.append(K.run_node(step.spec, step.attrs, args, dtypes, step.type))
    return values[-1]


def _region_flops(a: Attrs, ins: list[T], out: T) -> int:
    return out.numel * len(_parse_chain(a)[1])


FUSED = [
    _matmul_add("FusedMatMulAdd", -1, -2),
    _matmul_add("FusedMatMulATAdd", -2, -2),
    _matmul_add("FusedMatMulBTAdd", -1, -1),
    OpSpec("FusedMatMulBiasAct", Kind.FUSED, ("x", "w", "bias"), _bias_act_infer, K.fused_matmul_bias_act,
           (AttrSpec("act", S, "none", choices=EPILOGUES),), flops=matmul_flops,
           doc="act(x @ w + bias) with a bias of rank <= 1 and an optional Gelu/Silu epilogue."),
    OpSpec("FusedResidualLN", Kind.FUSED, ("x", "residual", "gamma", "beta"),
           norm_infer("FusedResidualLN", ("gamma", "beta"), residual=True),
           lambda a, x, r, g, b: K.layer_norm(x + r, g, b, a["axis"], a["eps"]), (_AXIS, _EPS),
           doc="LayerNorm(x + residual)."),
    OpSpec("FusedResidualRmsNorm", Kind.FUSED, ("x", "residual", "gamma", "beta?"),
           norm_infer("FusedResidualRmsNorm", ("gamma", "beta"), residual=True),
           lambda a, x, r, g, b=None: K.rms_norm(x + r, g, b, a["axis"], a["eps"]),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), doc="RmsNorm(x + residual)."),
    OpSpec("FusedRmsNormMatMul", Kind.FUSED, ("x", "w_norm", "w_proj"), _rms_matmul_infer,
           lambda a, x, wn, wp: np.matmul(K.rms_norm(x, wn, None, a["axis"], a["eps"]), wp),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), flops=_rms_matmul_flops,
           doc="RmsNorm(x, w_norm) @ w_proj."),
    OpSpec("SwiGLU", Kind.FUSED, ("gate", "up"), _swiglu_infer, lambda a, g, u: K.swiglu(g, u),
           doc="Silu(gate) * up."),
    OpSpec("FusedSwiGLU", Kind.FUSED, ("cat",), _fused_swiglu_infer, K.fused_swiglu,
           (AttrSpec("gate_first", B, False),),
           doc="up * Silu(gate) where cat = [up | gate] (or [gate | up] when gate_first)."),
    OpSpec("GroupNormSilu", Kind.FUSED, ("x", "w", "b"), lambda a, ins: op_spec("GroupNorm").infer(a, ins),
           lambda a, x, w, b: K.silu(K.group_norm(x, w, b, a["groups"], a["eps"])),
           (AttrSpec("groups", INT, check=at_least_one), _EPS), doc="Silu(GroupNorm(x, w, b))."),
    OpSpec("CausalAttentionRoPE", Kind.FUSED, ("q", "k", "v"), _causal_rope_infer,
           lambda a, q, k, v: K.sdpa(K.rope(q, a["theta"]), K.rope(k, a["theta"]), v, a["scale"], causal=True),
           (AttrSpec("theta", F, 10000.0, check=positive), AttrSpec("scale", F, 0.0, check=non_negative)),
           flops=attention_flops, canonical=causal_canonical, doc="CausalAttention(RoPE(q), RoPE(k), v)."),
    OpSpec("FusedAttentionBlock", Kind.FUSED, ("hidden", "qkv_w", "out_w", "mask", "qkv_b", "out_b"),
           _attention_block_infer, K.attention_block, (AttrSpec("heads", INT, check=at_least_one), _SCALE),
           flops=lambda a, ins, out: 2 * ins[0].numel * 4 * ins[0].shape[-1] + 4 * out.numel * ins[0].shape[1],
           doc="QKV matmul+bias, split, masked attention, output matmul+bias."),
    OpSpec("FusedTransformerLayer", Kind.FUSED,
           ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b",
            "ln2_g", "ln2_b", "mask"), _transformer_layer_infer, K.transformer_layer,
           (AttrSpec("heads", INT, check=at_least_one), _SCALE, AttrSpec("eps1", F, check=positive),
            AttrSpec("eps2", F, check=positive),
            AttrSpec("act", S, "gelu", choices=EPILOGUES)), flops=_transformer_layer_flops,
           doc="A whole post-norm BERT layer; inputs in the seed's 14-input order."),
    OpSpec("ElementwiseRegion", Kind.FUSED, ("xs*",), _region_infer, _region_kernel,
           (AttrSpec("chain", AttrType.JSON),), flops=_region_flops, canonical=_region_canonical,
           doc="A chain of elementwise ops run as one kernel, each step stored in its own dtype."),
    OpSpec("ConcatParams", Kind.WEIGHT_PREP, ("ws*",), concat_infer,
           lambda a, *ws: np.concatenate(ws, axis=a["axis"]), (_AXIS,),
           doc="A derived weight: parameters concatenated once at load time (recipe: sources, axis, order)."),
]
register(*FUSED)

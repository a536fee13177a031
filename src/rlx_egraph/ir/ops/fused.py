"""Fused ops (FUSIONS.md section 3).  Each kernel computes exactly what the
unfused subgraph it replaces computes; tests/test_fused_kernels.py proves it."""

from __future__ import annotations

import json

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


def region_steps(a: Attrs) -> list[tuple[str, dict, list[int]]]:
    """Decode an ElementwiseRegion chain: [op, attrs, operands] per step."""
    return [(op, attrs, operands) for op, attrs, operands in json.loads(a["chain"])]


def _resolve_chain(a: Attrs, ins: list[T]) -> tuple[list[list], T]:
    """Check a chain step by step; returns it with canonical attributes, and its type."""
    try:
        steps = region_steps(a)
    except (ValueError, TypeError) as exc:
        raise ShapeError(f"chain is not a JSON list of [op, attrs, operands]: {exc}") from None
    if not steps:
        raise ShapeError("chain must have at least one step")
    types: list[T] = []
    canonical: list[list] = []
    for k, (op, attrs, operands) in enumerate(steps):
        spec = REGISTRY.get(op)
        if spec is None or spec.kind is not Kind.ELEMENTWISE:
            raise ShapeError(f"chain step {k} op {op!r} is not an elementwise op")
        if any(i >= len(ins) or -i - 1 >= k for i in operands):
            raise ShapeError(f"chain step {k} refers to a missing operand in {operands}")
        step_in = [ins[i] if i >= 0 else types[-i - 1] for i in operands]
        resolved, out = spec.resolve(attrs, step_in)
        types.append(out)
        canonical.append([op, {key: list(v) if isinstance(v, tuple) else v for key, v in resolved.items()},
                          list(operands)])
    return canonical, types[-1]


def _region_canonical(a: Attrs, ins: list[T]) -> dict:
    return {**a, "chain": json.dumps(_resolve_chain(a, ins)[0])}


def _region_infer(a: Attrs, ins: list[T]) -> T:
    return _resolve_chain(a, ins)[1]


def _region_flops(a: Attrs, ins: list[T], out: T) -> int:
    return out.numel * len(json.loads(a["chain"]))


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
    OpSpec("ElementwiseRegion", Kind.FUSED, ("xs*",), _region_infer, K.elementwise_region,
           (AttrSpec("chain", AttrType.JSON),), flops=_region_flops, canonical=_region_canonical,
           doc="A chain of elementwise ops run as one kernel."),
    OpSpec("ConcatParams", Kind.WEIGHT_PREP, ("ws*",), concat_infer,
           lambda a, *ws: np.concatenate(ws, axis=a["axis"]), (_AXIS,),
           doc="A derived weight: parameters concatenated once at load time (recipe: sources, axis, order)."),
]
register(*FUSED)

"""The IO cost model: what a graph costs in launches, syncs, bytes and FLOPs.

Counting is target-free; a :class:`~rlx_egraph.cost.targets.Target` prices
the counts.  One function, :func:`node_cost`, counts a node: a node whose kind
launches nothing (leaves, layout views, load-time weight prep) costs nothing;
any other node is one kernel launch that moves the bytes of each input slot
plus its output, adds a host sync point if its kind is HOST_SYNC, and does
``spec.flops`` FLOPs.  A graph's profile (:mod:`rlx_egraph.cost.profile`) is the
sum of its node costs.

Host-sync ops (``Item``, ``NonZero``, ``Cond``: :mod:`rlx_egraph.ir.ops.host`) are
the ops whose value the host reads before the run goes on: each is a sync point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..ir.ops.primitives import matmul_flops
from ..ir.registry import REGISTRY, Kind, OpSpec, TensorType, TupleType


@dataclass(frozen=True)
class NodeCost:
    """The target-free cost of one node (``rows`` and ``matrices``: :func:`node_rows`, :func:`node_matrices`)."""

    launches: int
    syncs: int
    traffic_bytes: int
    flops: int
    rows: int = 0
    matrices: int = 0

    def __add__(self, other: NodeCost) -> NodeCost:
        return NodeCost(self.launches + other.launches, self.syncs + other.syncs,
                        self.traffic_bytes + other.traffic_bytes, self.flops + other.flops,
                        self.rows + other.rows, self.matrices + other.matrices)


FREE = NodeCost(0, 0, 0, 0)


# The variants of a convolution that onnxruntime runs on kernels of their own, each at its own FLOP rate: over one
# spatial axis (``1d``, as a speech model's feature extractor: an im2col and a GEMM, no blocked layout), and over two
# with one input channel per group (``depthwise``, as MobileNet's and ConvNeXt's: MLAS's depthwise kernel in its
# blocked layout), and over two with a 1x1 kernel and one group (``pointwise``, MobileNet's expand and project
# convolutions: MLAS's pointwise kernel in its blocked layout, which over a small image is bound by its weight bytes,
# not its FLOPs: some 22 B/ns at one thread where the weights outgrow the first-level cache).
# A 2-D convolution of one group whose input has fewer channels than onnxruntime's NCHWc block (``nchw``: an image
# network's stem over 3 colour channels, MobileNetV2's expansions of 8) reads its NCHW input as it is, on MLAS's NCHW
# kernel, several times slower per FLOP than the blocked one, and a model converts the input it reads from a blocked
# convolution back to NCHW first (onnxruntime's ReorderOutput).  The block is the CPU's vector width: 16 floats with
# AVX-512, 8 with AVX2; :data:`NCHWC_BLOCK` is the wider, so that the variant holds every convolution that reads NCHW
# on either (on an AVX2 CPU one of 8 to 15 channels runs blocked, and the line prices it as its samples measured).
ONE_D, DEPTHWISE, POINTWISE, NCHW = "1d", "depthwise", "pointwise", "nchw"
NCHWC_BLOCK = 16  # input channels of the widest NCHWc block (AVX-512)


def line_key(spec: OpSpec, attrs: Mapping[str, Any], in_types: Sequence[TensorType] = ()) -> str:
    """The measured line that prices a node on a target with per-op lines: its op's name; ``Op.value`` for an op
    whose attribute ``spec.cost_attr`` selects the kernels it is exported as (``FusedMatMulBiasAct.gelu``: MatMul
    + BiasGelu, ``FusedMatMulBiasAct.none``: Gemm); for a convolution (an op with ``groups``) over one spatial axis,
    its input ``in_types[0]`` [N, C, L], ``Op.1d`` (:data:`ONE_D`); over more, of more than one group with one input
    channel per group (its weight ``in_types[1]`` [O, 1, ...]), ``Op.depthwise`` (:data:`DEPTHWISE`); of one group
    with fewer input channels than :data:`NCHWC_BLOCK` (its weight [O, C, ...]), ``Op.nchw`` (:data:`NCHW`), else
    of one group with a 1x1 kernel (its weight [O, C, 1, 1]), ``Op.pointwise`` (:data:`POINTWISE`)."""
    if spec.cost_attr:
        return f"{spec.name}.{attrs[spec.cost_attr]}"
    groups = attrs.get("groups")
    if not isinstance(groups, int) or len(in_types) < 2:
        return spec.name
    if in_types[0].rank == 3:
        return f"{spec.name}.{ONE_D}"
    if groups > 1 and in_types[1].rank > 1 and in_types[1].shape[1] == 1:
        return f"{spec.name}.{DEPTHWISE}"
    if groups == 1 and in_types[1].rank > 2 and in_types[1].shape[1] < NCHWC_BLOCK:
        return f"{spec.name}.{NCHW}"
    if groups == 1 and in_types[1].rank > 2 and all(k == 1 for k in in_types[1].shape[2:]):
        return f"{spec.name}.{POINTWISE}"
    return spec.name


def line_op(key: str) -> str:
    """The op a line key (:func:`line_key`) prices."""
    return key.partition(".")[0]


def line_variant(key: str) -> str:
    """The variant a line key (:func:`line_key`) names after its op ("" for the op's own line)."""
    return key.partition(".")[2]


def names_a_line(key: str) -> bool:
    """Whether ``key`` can be a line key (:func:`line_key`): an op, ``Op.value`` for an op with a ``cost_attr``, or
    ``Op.1d``, ``Op.depthwise``, ``Op.nchw`` or ``Op.pointwise`` for an op with a ``groups`` attribute."""
    spec = REGISTRY.get(line_op(key))
    if spec is None:
        return False
    variant = line_variant(key)
    return (not variant or bool(spec.cost_attr)
            or (variant in (ONE_D, DEPTHWISE, NCHW, POINTWISE) and any(a.name == "groups" for a in spec.attrs)))


def node_launches(spec: OpSpec, copies: bool = False) -> int:
    """Kernel launches of one node: its kind's, or one for a layout op the target runs as a copy kernel."""
    return 1 if copies else spec.kind.launches


def node_cost(spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType], out_type: TensorType,
              copies: bool = False) -> NodeCost:
    """Count one node: launches, host syncs, device bytes moved, FLOPs, rows and matrices.  ``copies``: a layout op
    that the target runs as a copy kernel (:attr:`~rlx_egraph.cost.targets.Target.copied_layouts`), not as a
    view."""
    launches = node_launches(spec, copies)
    if launches == 0:  # nothing launched, nothing priced: the attributes and types are not read
        return FREE
    return NodeCost(
        launches=launches,
        syncs=int(spec.kind is Kind.HOST_SYNC),
        traffic_bytes=node_read_bytes(spec, in_types, out_type) + out_type.nbytes,
        flops=int(spec.flops(attrs, list(in_types), out_type)),
        rows=node_rows(attrs, out_type),
        matrices=node_matrices(spec, attrs, in_types, out_type),
    )


def node_read_bytes(spec: OpSpec, in_types: list[TensorType], out_type: TensorType | TupleType) -> int:
    """The bytes a node reads: each input whole, except that an op with index inputs (``OpSpec.index_inputs``:
    Embedding's ids) reads of each other input only the rows it gathers, at most as many bytes as it writes."""
    if not spec.index_inputs:
        return sum(t.nbytes for t in in_types)
    names, written = spec.input_names, out_type.nbytes
    return sum(t.nbytes if k < len(names) and names[k] in spec.index_inputs else min(t.nbytes, written)
               for k, t in enumerate(in_types))


def _first(t: TensorType | TupleType) -> TensorType:
    return _first(t.parts[0]) if isinstance(t, TupleType) else t


def node_rows(attrs: Mapping[str, Any], out_type: TensorType | TupleType) -> int:
    """The rows of a node's (first) output: its elements over its last dim (1 for a scalar), and for an op with
    ``heads`` that merges them into its last dim ([B, S, heads * D]) one per head: the rows an attention's
    Softmax runs over."""
    out = _first(out_type)
    rows = math.prod(out.shape[:-1])
    heads = attrs.get("heads")
    return rows * heads if isinstance(heads, int) and out.rank == 3 else rows


# A row of scores whose keys a mask masks (a causal prefill's, a padded batch row's) takes onnxruntime's softmax (its
# Softmax op's and its Attention kernel's) a slower path than an open row, whatever its length (one thread: some 84 ns
# more a row at 16 keys, the same with one key or half of them masked).  The calibration's samples feed open masks;
# :func:`masked_rows` counts the rows that may pay: those of the ops that onnxruntime runs as its Attention kernel
# (opset 23) given a mask the run computes (the op -> its mask input; a mask of the leaf ops whose values are fixed
# when the session loads, as an export's folded open mask, counts as open), and those of a Softmax over a mask's sum
# or fill.
MASKED_SCORES = {"BiasedAttention": "bias", "MultiHeadAttention": "bias", "KvCacheAttention": "bias"}
FIXED_MASKS = frozenset({"Param", "Constant", "Scalar"})
MASK_APPLIED = frozenset({"Add", "Where"})


def masked_rows(spec: OpSpec, attrs: Mapping[str, Any], in_ops: Sequence[str], out_type: TensorType | TupleType) -> int:
    """The score rows of a node whose inputs are of ops ``in_ops`` that a mask may mask keys of: every query row in
    every head (:func:`node_rows`) of an op of :data:`MASKED_SCORES` given a mask input the run computes (not of
    :data:`FIXED_MASKS`), and every row of a Softmax of an Add or a Where (:data:`MASK_APPLIED`); else 0.  Counted
    whole: a causal prefill masks keys in every row but the last, a padded batch in every row of its padded
    sequences."""
    mask = MASKED_SCORES.get(spec.name)
    if mask is not None:
        at = spec.input_names.index(mask)
        return node_rows(attrs, out_type) if at < len(in_ops) and in_ops[at] not in FIXED_MASKS else 0
    return node_rows(attrs, out_type) if spec.name == "Softmax" and in_ops[0] in MASK_APPLIED else 0


def node_matrices(spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
                  out_type: TensorType | TupleType) -> int:
    """The independent matrix products a node computes: one per batch and head of an op with ``heads`` (its first
    input [B, ...]) or of an attention whose query ``q`` is [B, H, S, D]; for an op whose FLOPs are one GEMM's, the
    product of the output's batch dims when its second operand has batch dims of its own (a 2-D weight: one GEMM
    over all rows); else 0."""
    heads = attrs.get("heads")
    if isinstance(heads, int):
        return in_types[0].shape[0] * heads
    if spec.input_names[:1] == ("q",) and in_types[0].rank == 4:
        return math.prod(in_types[0].shape[:2])
    if spec.flops is matmul_flops:
        return math.prod(_first(out_type).shape[:-2]) if math.prod(in_types[1].shape[:-2]) > 1 else 1
    return 0

"""Layer-level modules (HIR) and their lowering to MIR under a fusion policy.

A :class:`Module` records layers (``linear``, ``swiglu_ffn``, ``attention``,
``rms_norm``, ``layer_norm``, ``embedding``, ``transformer_block``, ``add``);
each layer creates its own named parameters (``<name>.weight``, ...), so a
module lowered under either policy reads the same weights.  Every layer is
checked when it is added (it is lowered at once), so a bad layer raises
:class:`GraphError` naming the layer and the MIR node.

The fusion policy decides what a layer becomes:

``direct``
    the layer's fused op (``FusedMatMulBiasAct``, ``FusedSwiGLU`` over one
    shared-input matmul, ``FusedAttentionBlock``, ``FusedTransformerLayer``, ...);
``fusable``
    primitive ops, left for the optimizer to fuse: the same lowering with
    separate projections instead of one matmul over concatenated weights, and
    every fused op replaced by its decomposition (``OpSpec.decompose``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..cost.targets import SEED_ATTENTION_BLOCK_MAX_TOKENS
from ..ir.decompose import decompose
from ..ir.graph import Graph, GraphError
from ..ir.ops.matmul import EPILOGUE_OPS, EPILOGUES
from ..ir.registry import TensorType

# The token bound for FusedAttentionBlock of the targets that keep the seed's (docs/fusions.md); ``direct``
# keeps to it.
ATTENTION_BLOCK_MAX_TOKENS: int = SEED_ATTENTION_BLOCK_MAX_TOKENS


class Stage(StrEnum):
    """Where a model stands in the pipeline: layers (HIR, a :class:`Module`), ops (MIR, a ``Graph``), or a launch
    order and memory plan (LIR, a ``Plan`` or ``CompileResult``)."""

    HIR = "hir"
    MIR = "mir"
    LIR = "lir"


class Policy(StrEnum):
    """What a layer lowers to: its fused op, or primitive ops for the optimizer to fuse."""

    DIRECT = "direct"
    FUSABLE = "fusable"


def policy_of(value: Policy | str) -> Policy:
    try:
        return Policy(value)
    except ValueError:
        raise ValueError(f"fusion policy must be one of {[p.value for p in Policy]}, got {value!r}") from None


@dataclass(frozen=True)
class Layer:
    """One recorded layer: ``kind`` applied to earlier values ``inputs`` (value = index of its layer)."""

    kind: str
    name: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


class _Lowering:
    """A MIR graph being built from layers under one policy; ``values[v]`` is value v's node id."""

    def __init__(self, name: str, policy: Policy) -> None:
        self.g = Graph(name)
        self.policy = policy
        self.values: list[int] = []

    @property
    def direct(self) -> bool:
        return self.policy is Policy.DIRECT

    def add(self, layer: Layer) -> None:
        inputs = [self.values[v] for v in layer.inputs]
        self.values.append(_LOWER[layer.kind](self, layer.name, inputs, layer.attrs))

    def param(self, name: str, shape: tuple[int, ...], like: int) -> int:
        """Parameter ``name`` in ``like``'s dtype."""
        return self.g.param(name, shape, self.g.node(like).dtype)

    def width(self, x: int) -> int:
        return self.g.node(x).shape[-1]

    def finish(self, outputs: Sequence[int]) -> Graph:
        self.g.set_outputs(self.values[v] for v in outputs)
        return self.g if self.direct else decompose(self.g)


def _activate(g: Graph, y: int, act: str) -> int:
    if act == "none":
        return y
    op, attrs = EPILOGUE_OPS[act]
    return g.add_node(op, [y], **attrs)


def _project(lw: _Lowering, x: int, name: str, features: int, bias: bool, act: str = "none") -> int:
    """``act(x @ <name>.weight + <name>.bias)``: FusedMatMulBiasAct with a bias, else MatMul and the act op."""
    w = lw.param(f"{name}.weight", (lw.width(x), features), x)
    if bias:
        return lw.g.fused_matmul_bias_act(x, w, lw.param(f"{name}.bias", (features,), x), act=act)
    return _activate(lw.g, lw.g.matmul(x, w), act)


def _concat(lw: _Lowering, x: int, names: Sequence[str], widths: Sequence[int], kind: str) -> int:
    """The derived weight ConcatParams of ``<name>.weight`` ([in, n]) or ``<name>.bias`` ([n]), last axis."""
    def shape(n: int) -> tuple[int, ...]:
        return (lw.width(x), n) if kind == "weight" else (n,)

    parts = [lw.param(f"{name}.{kind}", shape(n), x) for name, n in zip(names, widths, strict=True)]
    return lw.g.concat_params(parts, axis=-1)


def _projections(lw: _Lowering, x: int, names: Sequence[str], widths: Sequence[int], bias: bool) -> list[int]:
    """One projection of ``x`` per name: ``direct`` one matmul over the concatenated weights and a Narrow
    per name, ``fusable`` one matmul per name."""
    if not lw.direct:
        return [_project(lw, x, name, n, bias) for name, n in zip(names, widths, strict=True)]
    w = _concat(lw, x, names, widths, "weight")
    wide = lw.g.fused_matmul_bias_act(x, w, _concat(lw, x, names, widths, "bias")) if bias else lw.g.matmul(x, w)
    starts = [sum(widths[:k]) for k in range(len(widths))]
    return [lw.g.narrow(wide, axis=-1, start=s, length=n) for s, n in zip(starts, widths, strict=True)]


def _norm_params(lw: _Lowering, name: str, x: int, bias: bool) -> list[int]:
    shape = (lw.width(x),)
    gamma = lw.param(f"{name}.weight", shape, x)
    return [gamma, lw.param(f"{name}.bias", shape, x)] if bias else [gamma]


Attrs = dict[str, Any]
QKV = ("q_proj", "k_proj", "v_proj")


def _lower_input(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    return lw.g.input(name, a["shape"], a["dtype"])


def _check_act(act: str) -> None:
    if act not in EPILOGUES:
        raise GraphError(f"act={act!r} must be one of {list(EPILOGUES)}")


def _lower_linear(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    _check_act(a["act"])
    return _project(lw, ins[0], name, a["features"], a["bias"], a["act"])


def _lower_swiglu_ffn(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    """down(Silu(x @ gate) * (x @ up)): ``direct`` FusedSwiGLU over one matmul of the [gate | up] weights."""
    x, hidden = ins[0], a["hidden"]
    parts = (f"{name}.gate_proj", f"{name}.up_proj")
    if lw.direct:
        h = lw.g.fused_swiglu(lw.g.matmul(x, _concat(lw, x, parts, (hidden, hidden), "weight")), gate_first=True)
    else:
        h = lw.g.swiglu(*_projections(lw, x, parts, (hidden, hidden), bias=False))
    return lw.g.matmul(h, lw.param(f"{name}.down_proj.weight", (hidden, lw.width(x)), x))


def _block_applies(lw: _Lowering, x: int, mask: int | None, a: Attrs) -> bool:
    """Whether ``direct`` lowers an attention to FusedAttentionBlock: a key mask, biases, as many K/V heads
    as heads and at most ATTENTION_BLOCK_MAX_TOKENS tokens (the optimizer's guards)."""
    batch, seq = lw.g.node(x).shape[:2]
    return lw.direct and mask is not None and a["bias"] and a["kv_heads"] in (0, a["heads"]) \
        and batch * seq <= ATTENTION_BLOCK_MAX_TOKENS


def _head_dim(lw: _Lowering, x: int, heads: int) -> int:
    width = lw.width(x)
    if len(lw.g.node(x).shape) != 3 or heads < 1 or width % heads:
        raise GraphError(f"attention needs x [B, S, W] with W divisible by heads={heads}, got {lw.g.node(x).type}")
    return width // heads


def _lower_attention(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    """q/k/v projections, packed Attention (no mask, causal, or a [B, S] key mask), output projection."""
    x, mask = ins[0], (ins[1] if len(ins) > 1 else None)
    if a["mask"] not in ("none", "causal"):
        raise GraphError(f"mask={a['mask']!r} must be None, 'causal' or a key-mask value")
    width, heads = lw.width(x), a["heads"]
    head_dim = _head_dim(lw, x, heads)
    names = [f"{name}.{p}" for p in QKV]
    if _block_applies(lw, x, mask, a):
        return lw.g.fused_attention_block(
            x, _concat(lw, x, names, (width,) * 3, "weight"), lw.param(f"{name}.o_proj.weight", (width, width), x),
            mask, _concat(lw, x, names, (width,) * 3, "bias"), lw.param(f"{name}.o_proj.bias", (width,), x),
            heads=heads, scale=head_dim**-0.5)
    kv_width = (a["kv_heads"] or heads) * head_dim
    q, k, v = _projections(lw, x, names, (width, kv_width, kv_width), a["bias"])
    kind = "custom" if mask is not None else a["mask"]
    ctx = lw.g.attention(q, k, v, mask, heads=heads, kv_heads=a["kv_heads"], mask=kind, scale=head_dim**-0.5)
    return _project(lw, ctx, f"{name}.o_proj", width, a["bias"])


def _lower_transformer_block(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    """Post-norm BERT layer: attention, LayerNorm(attn + x), FFN (act), LayerNorm(ffn + h1).
    ``direct`` with a key mask under the token bound: one FusedTransformerLayer."""
    x, mask = ins[0], (ins[1] if len(ins) > 1 else None)
    _check_act(a["act"])
    _head_dim(lw, x, a["heads"])
    attention = {"heads": a["heads"], "kv_heads": 0, "mask": "none", "bias": True}
    if _block_applies(lw, x, mask, attention):
        return _fused_transformer_layer(lw, name, x, mask, a)
    attn = _lower_attention(lw, f"{name}.attention", ins, attention)
    h1 = lw.g.fused_residual_ln(attn, x, *_norm_params(lw, f"{name}.ln1", x, bias=True), eps=a["eps"])
    inner = _project(lw, h1, f"{name}.fc1", a["ffn"], bias=True, act=a["act"])
    ffn = _project(lw, inner, f"{name}.fc2", lw.width(x), bias=True)
    return lw.g.fused_residual_ln(ffn, h1, *_norm_params(lw, f"{name}.ln2", x, bias=True), eps=a["eps"])


def _fused_transformer_layer(lw: _Lowering, name: str, x: int, mask: int, a: Attrs) -> int:
    """FusedTransformerLayer over the composed block's parameters, in the seed's input order."""
    width, ffn = lw.width(x), a["ffn"]
    head_dim = _head_dim(lw, x, a["heads"])
    names = [f"{name}.attention.{p}" for p in QKV]
    qkv_w, qkv_b = _concat(lw, x, names, (width,) * 3, "weight"), _concat(lw, x, names, (width,) * 3, "bias")
    out_w = lw.param(f"{name}.attention.o_proj.weight", (width, width), x)
    out_b = lw.param(f"{name}.attention.o_proj.bias", (width,), x)
    ln1 = _norm_params(lw, f"{name}.ln1", x, bias=True)
    fc1 = lw.param(f"{name}.fc1.weight", (width, ffn), x), lw.param(f"{name}.fc1.bias", (ffn,), x)
    fc2 = lw.param(f"{name}.fc2.weight", (ffn, width), x), lw.param(f"{name}.fc2.bias", (width,), x)
    ln2 = _norm_params(lw, f"{name}.ln2", x, bias=True)
    return lw.g.fused_transformer_layer(x, qkv_w, qkv_b, out_w, out_b, *ln1, *fc1, *fc2, *ln2, mask,
                                        heads=a["heads"], scale=head_dim**-0.5, eps1=a["eps"], eps2=a["eps"],
                                        act=a["act"])


def _lower_rms_norm(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    return lw.g.rms_norm(ins[0], *_norm_params(lw, name, ins[0], bias=False), eps=a["eps"])


def _lower_layer_norm(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    return lw.g.layer_norm(ins[0], *_norm_params(lw, name, ins[0], bias=True), eps=a["eps"])


def _lower_embedding(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    return lw.g.embedding(lw.g.param(f"{name}.weight", (a["vocab"], a["dim"]), a["dtype"]), ins[0])


def _lower_add(lw: _Lowering, name: str, ins: list[int], a: Attrs) -> int:
    return lw.g.add(*ins)


_LOWER: dict[str, Callable[[_Lowering, str, list[int], Attrs], int]] = {
    "input": _lower_input, "linear": _lower_linear, "swiglu_ffn": _lower_swiglu_ffn, "attention": _lower_attention,
    "transformer_block": _lower_transformer_block, "rms_norm": _lower_rms_norm, "layer_norm": _lower_layer_norm,
    "embedding": _lower_embedding, "add": _lower_add,
}


class Module:
    """A layer-level model.  Layer methods take and return values (ints) and create named parameters.

    ``Module("ffn").swiglu_ffn(m.input("x", (4, 64)), 128, "mlp")`` creates ``mlp.gate_proj.weight``,
    ``mlp.up_proj.weight`` and ``mlp.down_proj.weight``; :meth:`lower` gives the MIR graph.
    """

    def __init__(self, name: str = "module", policy: Policy | str = Policy.DIRECT) -> None:
        self.name = name
        self.policy = policy_of(policy)
        self.layers: list[Layer] = []
        self.outputs: tuple[int, ...] = ()
        self._lowering = _Lowering(name, self.policy)

    # --- layers -------------------------------------------------------------------------------

    def input(self, name: str, shape: Sequence[int], dtype: str = "f32") -> int:
        """A graph input fed at run time."""
        return self._add("input", name, (), shape=tuple(shape), dtype=dtype)

    def linear(self, x: int, features: int, name: str, bias: bool = True, act: str = "none") -> int:
        """``act(x @ <name>.weight + <name>.bias)``; ``act`` is one of FusedMatMulBiasAct's epilogues."""
        return self._add("linear", name, (x,), features=features, bias=bias, act=act)

    def swiglu_ffn(self, x: int, hidden: int, name: str) -> int:
        """Llama MLP ``down_proj(Silu(gate_proj(x)) * up_proj(x))`` with ``hidden`` inner features."""
        return self._add("swiglu_ffn", name, (x,), hidden=hidden)

    def attention(self, x: int, heads: int, name: str, mask: int | str | None = None, kv_heads: int = 0,
                  bias: bool = True) -> int:
        """Multi-head attention on ``x`` [B, S, W]: ``mask`` None, ``"causal"`` or a [B, S] key-mask value;
        ``kv_heads`` (0: = heads) for grouped-query attention."""
        if isinstance(mask, str):
            return self._add("attention", name, (x,), heads=heads, kv_heads=kv_heads, mask=mask, bias=bias)
        inputs = (x,) if mask is None else (x, mask)
        return self._add("attention", name, inputs, heads=heads, kv_heads=kv_heads, mask="none", bias=bias)

    def transformer_block(self, x: int, heads: int, ffn: int, name: str, mask: int | None = None,
                          act: str = "gelu", eps: float = 1e-12) -> int:
        """A post-norm BERT layer (attention, residual LayerNorm, FFN with ``act``, residual LayerNorm)."""
        inputs = (x,) if mask is None else (x, mask)
        return self._add("transformer_block", name, inputs, heads=heads, ffn=ffn, act=act, eps=eps)

    def rms_norm(self, x: int, name: str, eps: float = 1e-6) -> int:
        return self._add("rms_norm", name, (x,), eps=eps)

    def layer_norm(self, x: int, name: str, eps: float = 1e-5) -> int:
        return self._add("layer_norm", name, (x,), eps=eps)

    def embedding(self, ids: int, vocab: int, dim: int, name: str, dtype: str = "f32") -> int:
        """Rows of ``<name>.weight`` [vocab, dim] gathered by the integer ``ids``."""
        return self._add("embedding", name, (ids,), vocab=vocab, dim=dim, dtype=dtype)

    def add(self, a: int, b: int, name: str = "add") -> int:
        """A residual connection."""
        return self._add("add", name, (a, b))

    def set_outputs(self, values: Sequence[int]) -> None:
        values = tuple(values)
        self._check_values(values, f"module {self.name!r}: output")
        self.outputs = values

    # --- queries and lowering -------------------------------------------------------------------

    @property
    def stage(self) -> Stage:
        """A module is the HIR stage: :meth:`lower` gives its MIR graph."""
        return Stage.HIR

    def type(self, value: int) -> TensorType:
        """The shape and dtype of ``value``."""
        self._check_values((value,), f"module {self.name!r}:")
        return self._lowering.g.node(self._lowering.values[value]).type

    def lower(self, policy: Policy | str | None = None) -> Graph:
        """The MIR graph of this module under ``policy`` (default: the module's)."""
        lowering = _Lowering(self.name, self.policy if policy is None else policy_of(policy))
        for layer in self.layers:
            lowering.add(layer)
        return lowering.finish(self.outputs)

    def _add(self, kind: str, name: str, inputs: tuple[int, ...], **attrs: Any) -> int:
        index = len(self.layers)
        self._check_values(inputs, f"layer {index} ({kind} {name!r}): input")
        layer = Layer(kind, name, inputs, attrs)
        try:
            self._lowering.add(layer)
        except GraphError as exc:
            self._lowering = _Lowering(self.name, self.policy)  # drop the failed layer's nodes
            for done in self.layers:
                self._lowering.add(done)
            raise GraphError(f"layer {index} ({kind} {name!r}): {exc}") from None
        self.layers.append(layer)
        return index


    def _check_values(self, values: Sequence[Any], what: str) -> None:
        bad = [v for v in values if not (isinstance(v, int) and 0 <= v < len(self.layers))]
        if bad:
            raise GraphError(f"{what} {bad[0]!r} is not a value of the module")


__all__ = ["ATTENTION_BLOCK_MAX_TOKENS", "Layer", "Module", "Policy", "Stage", "policy_of"]

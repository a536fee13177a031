"""ONNX test models in the forms PyTorch's exporters write, built with ``onnx.helper`` (no torch).

One builder per export form, so recognition-rule tests can reuse them:
:func:`bert_layer` (TorchScript, opset 14: LayerNorm decomposed, erf GELU, shape subgraphs
for the head reshapes, additive mask), :func:`gpt2_layer` (opset 17: LayerNormalization,
Gemm on flattened rows, Split of the fused QKV, gelu_new, causal mask by Trilu and Where),
:func:`llama_layer` (dynamo, opset 18: RMSNorm, RoPE rotate-half from an inv_freq buffer,
repeat_kv by Unsqueeze/Expand/Reshape, SiLU MLP) and :func:`sdpa_attention` (opset 17 sdpa
form: bool mask by Where, IsNaN -> Where after Softmax).  Dims ``batch`` and ``sequence``
are symbolic; weights are seeded random initializers.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


class OnnxBuilder:
    """Nodes, initializers and inputs of one ONNX graph; every ``op`` returns its output name(s)."""

    def __init__(self, opset: int, seed: int = 0) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.rng = np.random.default_rng(seed)

    def input(self, name: str, elem: int, dims: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, dims))
        return name

    def init(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name: str, *shape: int, scale: float | None = None) -> str:
        scale = 1.0 / math.sqrt(shape[0]) if scale is None else scale
        return self.init(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def const(self, value: object, dtype: type = np.float32) -> str:
        """A ``Constant`` node (as TorchScript writes scalars and shapes)."""
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype)))

    def ints(self, *values: int) -> str:
        return self.const(list(values), np.int64)

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, domain: str = "",
           **attrs: object) -> str | list[str]:
        k = len(self.nodes)
        names = [f"/{op_type}_{k}_output_{j}" for j in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"/{op_type}_{k}", domain=domain, **attrs))
        return names[0] if outputs == 1 else names

    def model(self, outputs: dict[str, str], extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
        """The model; ``outputs`` maps output names to the float values they expose (via Identity)."""
        for name, value in outputs.items():
            self.nodes.append(helper.make_node("Identity", [value], [name], name=f"/out/{name}"))
        imports = [helper.make_opsetid("", self.opset)]
        imports += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        graph = helper.make_graph(self.nodes, "test", self.inputs,
                                  [helper.make_tensor_value_info(n, F, None) for n in outputs], self.initializers)
        return helper.make_model(graph, opset_imports=imports, ir_version=9)

    # --- export forms shared by the models --------------------------------------------

    def linear(self, x: str, prefix: str, n_in: int, n_out: int, bias: bool = True) -> str:
        y = self.op("MatMul", [x, self.weight(f"{prefix}.weight", n_in, n_out)])
        return self.op("Add", [y, self.weight(f"{prefix}.bias", n_out, scale=0.1)]) if bias else y

    def layer_norm_decomposed(self, x: str, prefix: str, width: int, eps: float = 1e-12) -> str:
        """TorchScript at opset < 17: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul, Add."""
        d = self.op("Sub", [x, self.op("ReduceMean", [x], axes=[-1])])
        var = self.op("ReduceMean", [self.op("Pow", [d, self.const(2.0)])], axes=[-1])
        n = self.op("Div", [d, self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])])
        gamma = self.init(f"{prefix}.weight", 1.0 + 0.1 * self.rng.standard_normal(width).astype(np.float32))
        return self.op("Add", [self.op("Mul", [n, gamma]), self.weight(f"{prefix}.bias", width, scale=0.1)])

    def dims(self, x: str, *axes: int) -> list[str]:
        """``Shape -> Gather(axis k) -> Unsqueeze`` per axis: the dynamic-shape pieces of a Reshape target."""
        shape = self.op("Shape", [x])
        out = []
        for a in axes:
            d = self.op("Gather", [shape, self.const(a, np.int64)], axis=0)
            out.append(self.op("Unsqueeze", [d], axes=[0]) if self.opset < 13 else
                       self.op("Unsqueeze", [d, self.ints(0)]))
        return out

    def split_heads(self, x: str, heads: int, head_dim: int) -> str:
        b, s = self.dims(x, 0, 1)
        target = self.op("Concat", [b, s, self.ints(heads), self.ints(head_dim)], axis=0)
        return self.op("Transpose", [self.op("Reshape", [x, target])], perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, width: int) -> str:
        t = self.op("Transpose", [x], perm=[0, 2, 1, 3])
        b, s = self.dims(t, 0, 1)
        return self.op("Reshape", [t, self.op("Concat", [b, s, self.ints(width)], axis=0)])


def bert_layer(hidden: int = 16, heads: int = 2, ffn: int = 32) -> onnx.ModelProto:
    """A post-norm BERT encoder layer as TorchScript writes it at opset 14."""
    m = OnnxBuilder(14)
    x = m.input("hidden_states", F, ["batch", "sequence", hidden])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    hd = hidden // heads
    # extended mask: (1 - mask[:, None, None, :]) * -10000
    ext = m.op("Cast", [m.op("Unsqueeze", [m.op("Unsqueeze", [mask, m.ints(1)]), m.ints(2)])], to=F)
    add_mask = m.op("Mul", [m.op("Sub", [m.const(1.0), ext]), m.const(-10000.0)])
    q, k, v = (m.split_heads(m.linear(x, f"attention.self.{n}", hidden, hidden), heads, hd)
               for n in ("query", "key", "value"))
    scores = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(math.sqrt(hd))])
    probs = m.op("Softmax", [m.op("Add", [scores, add_mask])], axis=-1)
    ctx = m.merge_heads(m.op("MatMul", [probs, v]), hidden)
    attn = m.linear(ctx, "attention.output.dense", hidden, hidden)
    h1 = m.layer_norm_decomposed(m.op("Add", [attn, x]), "attention.output.LayerNorm", hidden)
    inner = m.linear(h1, "intermediate.dense", hidden, ffn)
    erf = m.op("Erf", [m.op("Div", [inner, m.const(1.4142135381698608)])])
    gelu = m.op("Mul", [m.op("Mul", [inner, m.op("Add", [erf, m.const(1.0)])]), m.const(0.5)])
    out = m.linear(gelu, "output.dense", ffn, hidden)
    return m.model({"last_hidden_state": m.layer_norm_decomposed(m.op("Add", [out, h1]), "output.LayerNorm", hidden)})


def gpt2_layer(hidden: int = 16, heads: int = 2, max_positions: int = 32) -> onnx.ModelProto:
    """A GPT-2 block at opset 17: LayerNormalization, Conv1D as Gemm on rows, Split QKV, causal Where, gelu_new."""
    m = OnnxBuilder(17)
    x = m.input("hidden_states", F, ["batch", "sequence", hidden])
    hd = hidden // heads

    def ln(t: str, prefix: str) -> str:
        return m.op("LayerNormalization", [t, m.init(f"{prefix}.weight", np.ones(hidden, np.float32)),
                                            m.weight(f"{prefix}.bias", hidden, scale=0.1)], axis=-1, epsilon=1e-5)

    def conv1d(t: str, prefix: str, n_in: int, n_out: int) -> str:
        b, s = m.dims(t, 0, 1)
        rows = m.op("Reshape", [t, m.ints(-1, n_in)])
        weight, bias = m.weight(f"{prefix}.weight", n_in, n_out), m.weight(f"{prefix}.bias", n_out, scale=0.1)
        y = m.op("Gemm", [rows, weight, bias])
        return m.op("Reshape", [y, m.op("Concat", [b, s, m.ints(n_out)], axis=0)])

    y = ln(x, "ln_1")
    q, k, v = m.op("Split", [conv1d(y, "attn.c_attn", hidden, 3 * hidden), m.ints(hidden, hidden, hidden)],
                   outputs=3, axis=2)
    q, k, v = (m.split_heads(t, heads, hd) for t in (q, k, v))
    scores = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(math.sqrt(hd))])
    # causal mask: the bias buffer sliced to [:, :, :S, :S], Where(mask, scores, finfo.min)
    seq = m.dims(x, 1)[0]
    bias = m.init("attn.bias", np.tril(np.ones((max_positions, max_positions), bool))[None, None])
    causal = m.op("Slice", [m.op("Slice", [bias, m.ints(0), seq, m.ints(2)]), m.ints(0), seq, m.ints(3)])
    scores = m.op("Where", [causal, scores, m.const(np.finfo(np.float32).min)])
    ctx = m.merge_heads(m.op("MatMul", [m.op("Softmax", [scores], axis=-1), v]), hidden)
    h = m.op("Add", [conv1d(ctx, "attn.c_proj", hidden, hidden), x])
    fc = conv1d(ln(h, "ln_2"), "mlp.c_fc", hidden, 4 * hidden)
    inner = m.op("Add", [fc, m.op("Mul", [m.op("Pow", [fc, m.const(3.0)]), m.const(0.044715)])])
    t = m.op("Tanh", [m.op("Mul", [inner, m.const(math.sqrt(2.0 / math.pi))])])
    gelu = m.op("Mul", [m.op("Mul", [fc, m.const(0.5)]), m.op("Add", [t, m.const(1.0)])])
    return m.model({"output": m.op("Add", [conv1d(gelu, "mlp.c_proj", 4 * hidden, hidden), h])})


def llama_layer(hidden: int = 16, heads: int = 4, kv_heads: int = 2, ffn: int = 24, eps: float = 1e-6,
                theta: float = 10000.0) -> onnx.ModelProto:
    """A Llama decoder layer as the dynamo exporter writes it at opset 18."""
    m = OnnxBuilder(18)
    x = m.input("hidden_states", F, ["batch", "sequence", hidden])
    hd = hidden // heads
    rep = heads // kv_heads

    def rms(t: str, prefix: str) -> str:
        var = m.op("ReduceMean", [m.op("Pow", [t, m.const(2.0)]), m.ints(-1)], keepdims=1)
        inv = m.op("Reciprocal", [m.op("Sqrt", [m.op("Add", [var, m.const(eps)])])])
        gamma = m.init(f"{prefix}.weight", 1.0 + 0.1 * m.rng.standard_normal(hidden).astype(np.float32))
        return m.op("Mul", [gamma, m.op("Mul", [t, inv])])

    # rotary tables from the inv_freq buffer and positions Range(0, S)
    seq = m.op("Squeeze", [m.dims(x, 1)[0], m.ints(0)])
    positions = m.op("Cast", [m.op("Range", [m.const(0, np.int64), seq, m.const(1, np.int64)])], to=F)
    inv_freq = m.init("rotary_emb.inv_freq", 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    freqs = m.op("Mul", [m.op("Unsqueeze", [positions, m.ints(1)]), m.op("Unsqueeze", [inv_freq, m.ints(0)])])
    emb = m.op("Concat", [freqs, freqs], axis=-1)
    cos, sin = m.op("Cos", [emb]), m.op("Sin", [emb])

    def rope(t: str) -> str:
        first = m.op("Slice", [t, m.ints(0), m.ints(hd // 2), m.ints(3)])
        second = m.op("Slice", [t, m.ints(hd // 2), m.ints(2**62), m.ints(3)])
        rotated = m.op("Concat", [m.op("Neg", [second]), first], axis=-1)
        return m.op("Add", [m.op("Mul", [t, cos]), m.op("Mul", [rotated, sin])])

    def repeat_kv(t: str) -> str:
        b, _, s, _ = m.dims(t, 0, 1, 2, 3)
        wide = m.op("Concat", [b, m.ints(kv_heads), m.ints(rep), s, m.ints(hd)], axis=0)
        grown = m.op("Expand", [m.op("Unsqueeze", [t, m.ints(2)]), wide])
        return m.op("Reshape", [grown, m.op("Concat", [b, m.ints(heads), s, m.ints(hd)], axis=0)])

    y = rms(x, "input_layernorm")
    q = rope(m.split_heads(m.linear(y, "self_attn.q_proj", hidden, heads * hd, bias=False), heads, hd))
    k = repeat_kv(rope(m.split_heads(m.linear(y, "self_attn.k_proj", hidden, kv_heads * hd, bias=False),
                                     kv_heads, hd)))
    v = repeat_kv(m.split_heads(m.linear(y, "self_attn.v_proj", hidden, kv_heads * hd, bias=False), kv_heads, hd))
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(hd**-0.5)])
    full = m.op("ConstantOfShape", [m.op("Concat", [m.dims(x, 1)[0], m.dims(x, 1)[0]], axis=0)],
                value=numpy_helper.from_array(np.array([-np.inf], np.float32)))
    scores = m.op("Add", [scores, m.op("Trilu", [full, m.const(1, np.int64)], upper=1)])
    ctx = m.merge_heads(m.op("MatMul", [m.op("Softmax", [scores], axis=-1), v]), hidden)
    h = m.op("Add", [x, m.linear(ctx, "self_attn.o_proj", hidden, hidden, bias=False)])
    z = rms(h, "post_attention_layernorm")
    gate = m.linear(z, "mlp.gate_proj", hidden, ffn, bias=False)
    up = m.linear(z, "mlp.up_proj", hidden, ffn, bias=False)
    act = m.op("Mul", [m.op("Mul", [gate, m.op("Sigmoid", [gate])]), up])
    return m.model({"output": m.op("Add", [h, m.linear(act, "mlp.down_proj", ffn, hidden, bias=False)])})


def sdpa_attention(hidden: int = 16, heads: int = 2) -> onnx.ModelProto:
    """Self-attention in the opset-17 sdpa export form: q and k each scaled by sqrt(scale), a bool key mask
    turned additive by Where, and Where(IsNaN(p), 0, p) after the Softmax."""
    m = OnnxBuilder(17)
    x = m.input("hidden_states", F, ["batch", "sequence", hidden])
    mask = m.input("attention_mask", TensorProto.BOOL, ["batch", "sequence"])
    hd = hidden // heads
    q, k, v = (m.split_heads(m.linear(x, f"{n}_proj", hidden, hidden), heads, hd) for n in ("q", "k", "v"))
    root = m.const(math.sqrt(1.0 / math.sqrt(hd)))
    kt = m.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = m.op("MatMul", [m.op("Mul", [q, root]), m.op("Mul", [kt, root])])
    keep = m.op("Unsqueeze", [mask, m.ints(1, 2)])
    additive = m.op("Where", [keep, m.const(0.0), m.const(-np.inf)])
    probs = m.op("Softmax", [m.op("Add", [scores, additive])], axis=-1)
    probs = m.op("Where", [m.op("IsNaN", [probs]), m.const(0.0), probs])
    ctx = m.merge_heads(m.op("MatMul", [probs, v]), hidden)
    return m.model({"attn_output": m.linear(ctx, "o_proj", hidden, hidden)})


def conv_bn(m: OnnxBuilder, x: str, prefix: str, c_in: int, c_out: int, kernel: int = 3, stride: int = 1,
            bias: bool = False, bn: bool = True) -> str:
    """Conv (pads kernel // 2) then, with ``bn``, an inference BatchNormalization of initializers, as exports
    of torchvision/transformers ResNets write them."""
    ins = [x, m.weight(f"{prefix}.weight", c_out, c_in, kernel, kernel, scale=1.0 / math.sqrt(c_in * kernel**2))]
    if bias:
        ins.append(m.weight(f"{prefix}.bias", c_out, scale=0.1))
    pad = kernel // 2
    y = m.op("Conv", ins, kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)
    if not bn:
        return y
    stats = [m.init(f"{prefix}.bn.scale", 1.0 + 0.1 * m.rng.standard_normal(c_out).astype(np.float32)),
             m.weight(f"{prefix}.bn.bias", c_out, scale=0.1), m.weight(f"{prefix}.bn.mean", c_out, scale=0.1),
             m.init(f"{prefix}.bn.var", m.rng.uniform(0.5, 1.5, c_out).astype(np.float32))]
    return m.op("BatchNormalization", [y, *stats], epsilon=1e-5)


def resnet_block(channels: int = 8, out_channels: int = 8, stride: int = 1, act: str = "Relu", size: int = 8,
                 opset: int = 17) -> onnx.ModelProto:
    """A ResNet basic block: conv-bn-act, conv-bn, + the shortcut (a 1x1 conv-bn when the shape changes), act.
    ``act`` "Relu" or "Clip" (ReLU6: Clip with bounds 0 and 6)."""
    m = OnnxBuilder(opset)
    x = m.input("pixel_values", F, [1, channels, size, size])

    def activation(t: str) -> str:
        return m.op("Relu", [t]) if act == "Relu" else m.op("Clip", [t, m.const(0.0), m.const(6.0)])

    h = activation(conv_bn(m, x, "conv1", channels, out_channels, stride=stride))
    h = conv_bn(m, h, "conv2", out_channels, out_channels)
    shortcut = x if stride == 1 and channels == out_channels else \
        conv_bn(m, x, "downsample", channels, out_channels, kernel=1, stride=stride)
    return m.model({"last_hidden_state": activation(m.op("Add", [h, shortcut]))})


MODELS = {"bert": bert_layer, "gpt2": gpt2_layer, "llama": llama_layer, "sdpa": sdpa_attention}


def feeds(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: floats normal, int64 masks of ones with the last key of batch row 1 dropped, bool alike."""
    rng = np.random.default_rng(seed)
    out = {}
    for info in model.graph.input:
        shape = shapes[info.name]
        elem = info.type.tensor_type.elem_type
        if elem == F:
            out[info.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            mask = np.ones(shape, bool)
            if shape[0] > 1:
                mask[1, -1] = False
            out[info.name] = mask.astype(helper.tensor_dtype_to_np_dtype(elem))
    return out


# --- whole models in each exporter's dynamic form: what the exporters build from Shape of a symbolic input -----


def _batch_seq(m: OnnxBuilder, x: str) -> tuple[str, str]:
    """``Shape(x)[0]`` and ``Shape(x)[1]`` as 0-d values (TorchScript's ``x.size(0)``, ``x.size(1)``)."""
    shape = m.op("Shape", [x])
    return tuple(m.op("Gather", [shape, m.const(k, np.int64)], axis=0) for k in (0, 1))  # type: ignore[return-value]


def _unsqueeze(m: OnnxBuilder, x: str, *axes: int) -> str:
    return m.op("Unsqueeze", [x], axes=list(axes)) if m.opset < 13 else m.op("Unsqueeze", [x, m.ints(*axes)])


def _vector(m: OnnxBuilder, *scalars: str) -> str:
    """0-d values as a 1-D shape tensor (Unsqueeze each, Concat)."""
    return m.op("Concat", [_unsqueeze(m, s, 0) for s in scalars], axis=0)


def _expand_size(m: OnnxBuilder, exporter: str, *dims: str | int) -> str:
    """The target of ``x.expand(*dims)``, where -1 keeps a dim: TorchScript turns each -1 into 1 by Where(size ==
    -1, 1, size); dynamo (onnxscript's aten_expand) by Abs."""
    size = _vector(m, *(m.const(d, np.int64) if isinstance(d, int) else d for d in dims))
    if exporter == "dynamo":
        return m.op("Abs", [size])
    ones = m.op("ConstantOfShape", [m.op("Shape", [size])], value=numpy_helper.from_array(np.array([1], np.int64)))
    minus = m.op("Mul", [ones, m.const(-1, np.int64)])
    return m.op("Where", [m.op("Equal", [size, minus]), ones, size])


def _range(m: OnnxBuilder, start: str | int, limit: str) -> str:
    start = m.const(start, np.int64) if isinstance(start, int) else start
    return m.op("Range", [start, limit, m.const(1, np.int64)])


def _padding_keep(m: OnnxBuilder, mask: str, batch: str, kv: str, exporter: str) -> str:
    """transformers' ``padding_mask[batch_idx, kv_idx]`` with batch_idx = arange(B)[:, None, None, None] and
    kv_idx = arange(KV)[None, None, None, :]: [B, 1, 1, KV] bool.  dynamo: GatherND on the broadcast index pairs;
    TorchScript: a Gather on the flattened mask at b * KV + k."""
    keep = m.op("Cast", [mask], to=TensorProto.BOOL)
    b_idx = _unsqueeze(m, _range(m, 0, batch), 1, 2, 3)
    k_idx = _unsqueeze(m, _range(m, 0, kv), 0, 1, 2)
    if exporter == "dynamo":
        target = m.op("Shape", [m.op("Add", [b_idx, k_idx])])
        pairs = [_unsqueeze(m, m.op("Expand", [i, target]), -1) for i in (b_idx, k_idx)]
        return m.op("GatherND", [keep, m.op("Concat", pairs, axis=-1)])
    flat = m.op("Flatten", [keep], axis=2)
    index = m.op("Add", [k_idx, m.op("Mul", [b_idx, kv])])
    gathered = m.op("Gather", [flat, index], axis=0)  # [B, 1, 1, KV, 1]
    return m.op("Reshape", [gathered, m.op("Shape", [index])])


def _causal_keep(m: OnnxBuilder, q_positions: str, kv: str) -> str:
    """transformers 5's causal mask function, not vmapped: kv_idx[None, None, None, :] <= q_idx[None, None, :, None]
    ([1, 1, Q, KV] bool)."""
    k_idx = _unsqueeze(m, _range(m, 0, kv), 0, 1, 2)
    q_idx = _unsqueeze(m, q_positions, 0, 1, 3)
    return m.op("LessOrEqual", [k_idx, q_idx])


def _attention(m: OnnxBuilder, x: str, prefix: str, hidden: int, heads: int, kv_heads: int, bias: str,
               rope: tuple[str, str] | None = None) -> str:
    """Eager attention with an additive float mask ``bias`` [B or 1, 1, Q, KV] sliced to the keys' length, GQA
    repeat_kv on symbolic dims."""
    hd = hidden // heads
    q = m.split_heads(m.linear(x, f"{prefix}.q_proj", hidden, hidden, bias=rope is None), heads, hd)
    k = m.split_heads(m.linear(x, f"{prefix}.k_proj", hidden, kv_heads * hd, bias=rope is None), kv_heads, hd)
    v = m.split_heads(m.linear(x, f"{prefix}.v_proj", hidden, kv_heads * hd, bias=rope is None), kv_heads, hd)
    if rope is not None:
        cos, sin = (_unsqueeze(m, t, 1) for t in rope)

        def rotate(t: str) -> str:
            first = m.op("Slice", [t, m.ints(0), m.ints(hd // 2), m.ints(3)])
            second = m.op("Slice", [t, m.ints(hd // 2), m.ints(2**62), m.ints(3)])
            return m.op("Add", [m.op("Mul", [t, cos]), m.op("Mul", [m.op("Concat", [m.op("Neg", [second]), first],
                                                                           axis=-1), sin])])

        q, k = rotate(q), rotate(k)
    if kv_heads != heads:
        rep = heads // kv_heads

        def repeat_kv(t: str) -> str:
            b, _, s, _ = m.dims(t, 0, 1, 2, 3)
            wide = m.op("Concat", [b, m.ints(kv_heads), m.ints(rep), s, m.ints(hd)], axis=0)
            grown = m.op("Expand", [_unsqueeze(m, t, 2), wide])
            return m.op("Reshape", [grown, m.op("Concat", [b, m.ints(heads), s, m.ints(hd)], axis=0)])

        k, v = repeat_kv(k), repeat_kv(v)
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(hd**-0.5)])
    keys = m.dims(k, 2)[0]
    sliced = m.op("Slice", [bias, m.ints(0), keys, m.ints(3)])  # causal_mask[:, :, :, : key_states.shape[-2]]
    probs = m.op("Softmax", [m.op("Add", [scores, sliced])], axis=-1)
    ctx = m.merge_heads(m.op("MatMul", [probs, v]), hidden)
    return m.linear(ctx, f"{prefix}.o_proj", hidden, hidden, bias=rope is None)


def bert_model(exporter: str = "torchscript", hidden: int = 16, heads: int = 2, vocab: int = 40,
               max_positions: int = 32, layers: int = 1) -> onnx.ModelProto:
    """BERT's embeddings and ``layers`` encoder layers from token ids: the position and token-type buffers sliced to
    [:sequence] (Slice with an end from Shape), the token types expanded to [batch, sequence], the padding mask
    made additive; TorchScript writes the LayerNorms decomposed at opset 14, dynamo LayerNormalization at 18."""
    m = OnnxBuilder(14 if exporter == "torchscript" else 18)
    ids = m.input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    batch, seq = _batch_seq(m, ids)
    end = _unsqueeze(m, seq, 0)
    positions = m.op("Slice", [m.init("embeddings.position_ids", np.arange(max_positions, dtype=np.int64)[None]),
                               m.ints(0), end, m.ints(1)])
    types = m.op("Slice", [m.init("embeddings.token_type_ids", np.zeros((1, max_positions), np.int64)), m.ints(0),
                           end, m.ints(1)])
    types = m.op("Expand", [types, _vector(m, batch, seq)])

    def ln(x: str, prefix: str) -> str:
        if exporter == "torchscript":
            return m.layer_norm_decomposed(x, prefix, hidden)
        gamma = m.init(f"{prefix}.weight", 1.0 + 0.1 * m.rng.standard_normal(hidden).astype(np.float32))
        return m.op("LayerNormalization", [x, gamma, m.weight(f"{prefix}.bias", hidden, scale=0.1)], axis=-1,
                    epsilon=1e-12)

    emb = m.op("Add", [m.op("Gather", [m.weight("embeddings.word_embeddings.weight", vocab, hidden), ids]),
                       m.op("Gather", [m.weight("embeddings.token_type_embeddings.weight", 2, hidden), types])])
    emb = m.op("Add", [emb, m.op("Gather", [m.weight("embeddings.position_embeddings.weight", max_positions, hidden),
                                            positions])])
    x = ln(emb, "embeddings.LayerNorm")
    ext = m.op("Cast", [_unsqueeze(m, mask, 1, 2)], to=F)
    additive = m.op("Mul", [m.op("Sub", [m.const(1.0), ext]), m.const(float(np.finfo(np.float32).min))])
    hd = hidden // heads
    for layer in range(layers):
        p = f"encoder.layer.{layer}."
        q, k, v = (m.split_heads(m.linear(x, f"{p}attention.self.{n}", hidden, hidden), heads, hd)
                   for n in ("query", "key", "value"))
        scores = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(math.sqrt(hd))])
        ctx = m.merge_heads(m.op("MatMul", [m.op("Softmax", [m.op("Add", [scores, additive])], axis=-1), v]), hidden)
        h = ln(m.op("Add", [m.linear(ctx, f"{p}attention.output.dense", hidden, hidden), x]),
               f"{p}attention.output.LayerNorm")
        inner = m.linear(h, f"{p}intermediate.dense", hidden, 2 * hidden)
        erf = m.op("Erf", [m.op("Div", [inner, m.const(math.sqrt(2.0))])])
        gelu = m.op("Mul", [m.op("Mul", [inner, m.op("Add", [erf, m.const(1.0)])]), m.const(0.5)])
        x = ln(m.op("Add", [m.linear(gelu, f"{p}output.dense", 2 * hidden, hidden), h]), f"{p}output.LayerNorm")
    return m.model({"last_hidden_state": x})


def gpt2_model(exporter: str = "torchscript", hidden: int = 16, heads: int = 2, vocab: int = 40,
               max_positions: int = 32, layers: int = 1) -> onnx.ModelProto:
    """GPT-2 from token ids: positions from the attention mask (CumSum(mask) * mask - 1, as generation writes them)
    gathered from wpe; TorchScript: the causal buffer [1, 1, N, N] sliced to [:sequence, :sequence] and Where'd
    into the scores, the padding mask added; dynamo: transformers 5's mask (Range comparisons and the padding mask
    by GatherND, ANDed, made additive)."""
    m = OnnxBuilder(17 if exporter == "torchscript" else 18)
    ids = m.input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    batch, seq = _batch_seq(m, ids)
    positions = m.op("Sub", [m.op("Mul", [m.op("CumSum", [mask, m.const(1, np.int64)]), mask]), m.const(1, np.int64)])
    positions = m.op("Max", [positions, m.const(0, np.int64)])
    x = m.op("Add", [m.op("Gather", [m.weight("wte.weight", vocab, hidden), ids]),
                     m.op("Gather", [m.weight("wpe.weight", max_positions, hidden), positions])])
    lowest = m.const(float(np.finfo(np.float32).min))
    if exporter == "torchscript":
        bias = m.init("attn.bias", np.tril(np.ones((max_positions, max_positions), bool))[None, None])
        end = _unsqueeze(m, seq, 0)
        causal = m.op("Slice", [m.op("Slice", [bias, m.ints(0), end, m.ints(2)]), m.ints(0), end, m.ints(3)])
        keep = m.op("And", [causal, _padding_keep(m, mask, batch, seq, exporter)])
    else:
        keep = m.op("And", [_causal_keep(m, _range(m, 0, seq), seq), _padding_keep(m, mask, batch, seq, exporter)])
    bias = m.op("Where", [keep, m.const(0.0), lowest])

    def ln(t: str, prefix: str) -> str:
        return m.op("LayerNormalization", [t, m.init(f"{prefix}.weight", np.ones(hidden, np.float32)),
                                           m.weight(f"{prefix}.bias", hidden, scale=0.1)], axis=-1, epsilon=1e-5)

    for layer in range(layers):
        p = f"h.{layer}."
        h = m.op("Add", [_attention(m, ln(x, f"{p}ln_1"), f"{p}attn", hidden, heads, heads, bias), x])
        fc = m.linear(ln(h, f"{p}ln_2"), f"{p}mlp.c_fc", hidden, 4 * hidden)
        inner = m.op("Add", [fc, m.op("Mul", [m.op("Pow", [fc, m.const(3.0)]), m.const(0.044715)])])
        t = m.op("Tanh", [m.op("Mul", [inner, m.const(math.sqrt(2.0 / math.pi))])])
        gelu = m.op("Mul", [m.op("Mul", [fc, m.const(0.5)]), m.op("Add", [t, m.const(1.0)])])
        x = m.op("Add", [m.linear(gelu, f"{p}mlp.c_proj", 4 * hidden, hidden), h])
    return m.model({"last_hidden_state": x})


def llama_model(exporter: str = "dynamo", hidden: int = 16, heads: int = 4, kv_heads: int = 2, ffn: int = 24,
                padding: bool = False, theta: float = 10000.0, layers: int = 1) -> onnx.ModelProto:
    """A Llama decoder layer from hidden states: cache positions Range(0, sequence), rotary tables from inv_freq
    expanded to [batch, D/2, 1] @ positions, GQA repeat_kv on symbolic dims; the causal mask either
    ConstantOfShape([S, S], -inf) -> Trilu(k=1) (TorchScript's older form) or transformers 5's Range comparison
    (dynamo), with the padding mask ANDed in when ``padding``."""
    m = OnnxBuilder(17 if exporter == "torchscript" else 18)
    x = m.input("hidden_states", F, ["batch", "sequence", hidden])
    inputs_mask = m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"]) if padding else None
    batch, seq = _batch_seq(m, x)
    hd = hidden // heads
    cache_positions = _range(m, 0, seq)
    positions = _unsqueeze(m, cache_positions, 0)  # [1, S]
    inv_freq = m.init("rotary_emb.inv_freq", (1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd)))
    expanded = m.op("Expand", [_unsqueeze(m, inv_freq, 0, 2), _expand_size(m, exporter, batch, -1, 1)])
    freqs = m.op("Transpose", [m.op("MatMul", [expanded, m.op("Cast", [_unsqueeze(m, positions, 1)], to=F)])],
                 perm=[0, 2, 1])
    emb = m.op("Concat", [freqs, freqs], axis=-1)
    cos, sin = m.op("Cos", [emb]), m.op("Sin", [emb])
    lowest = float(np.finfo(np.float32).min)
    if exporter == "torchscript" and not padding:
        full = m.op("ConstantOfShape", [_vector(m, seq, seq)], value=numpy_helper.from_array(np.array([lowest],
                                                                                                     np.float32)))
        bias = _unsqueeze(m, m.op("Trilu", [full, m.const(1, np.int64)], upper=1), 0, 1)
    else:
        keep = _causal_keep(m, cache_positions, seq)
        if inputs_mask is not None:
            keep = m.op("And", [keep, _padding_keep(m, inputs_mask, batch, seq, exporter)])
        bias = m.op("Where", [keep, m.const(0.0), m.const(lowest)])

    def rms(t: str, prefix: str) -> str:
        var = m.op("ReduceMean", [m.op("Pow", [t, m.const(2.0)]), m.ints(-1)], keepdims=1) if m.opset >= 18 else \
            m.op("ReduceMean", [m.op("Pow", [t, m.const(2.0)])], axes=[-1], keepdims=1)
        inv = m.op("Reciprocal", [m.op("Sqrt", [m.op("Add", [var, m.const(1e-6)])])])
        gamma = m.init(f"{prefix}.weight", 1.0 + 0.1 * m.rng.standard_normal(hidden).astype(np.float32))
        return m.op("Mul", [gamma, m.op("Mul", [t, inv])])

    for layer in range(layers):
        p = f"layers.{layer}."
        h = m.op("Add", [x, _attention(m, rms(x, f"{p}input_layernorm"), f"{p}self_attn", hidden, heads, kv_heads,
                                       bias, (cos, sin))])
        z = rms(h, f"{p}post_attention_layernorm")
        gate = m.linear(z, f"{p}mlp.gate_proj", hidden, ffn, bias=False)
        up = m.linear(z, f"{p}mlp.up_proj", hidden, ffn, bias=False)
        act = m.op("Mul", [m.op("Mul", [gate, m.op("Sigmoid", [gate])]), up])
        x = m.op("Add", [h, m.linear(act, f"{p}mlp.down_proj", ffn, hidden, bias=False)])
    return m.model({"last_hidden_state": x})


def bound_shapes(model: onnx.ModelProto, binding: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Each input's shape with its dim_params replaced by their values in ``binding``."""
    return {i.name: tuple(binding[d.dim_param] if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input}


def dynamic_feeds(model: onnx.ModelProto, binding: dict[str, int], seed: int = 0,
                  vocab: int = 40) -> dict[str, np.ndarray]:
    """Seeded inputs at ``binding``: token ids in [0, vocab), masks that drop batch row 1's last key, floats normal."""
    rng = np.random.default_rng(seed)
    out = feeds(model, bound_shapes(model, binding), seed)
    if "input_ids" in out:
        out["input_ids"] = rng.integers(0, vocab, out["input_ids"].shape).astype(np.int64)
    return out


# (model, exporter) -> the builder: every form is imported without bindings in tests/test_onnx_dynamic.py
DYNAMIC_MODELS = {
    ("bert", "torchscript"): lambda: bert_model("torchscript"),
    ("bert", "dynamo"): lambda: bert_model("dynamo"),
    ("gpt2", "torchscript"): lambda: gpt2_model("torchscript"),
    ("gpt2", "dynamo"): lambda: gpt2_model("dynamo"),
    ("llama", "torchscript"): lambda: llama_model("torchscript"),
    ("llama", "dynamo"): lambda: llama_model("dynamo"),
    ("llama-padded", "torchscript"): lambda: llama_model("torchscript", padding=True),
    ("llama-padded", "dynamo"): lambda: llama_model("dynamo", padding=True),
}


__all__ = ["DYNAMIC_MODELS", "MODELS", "OnnxBuilder", "bert_layer", "bert_model", "bound_shapes", "dynamic_feeds",
           "feeds", "gpt2_layer", "gpt2_model",
           "llama_layer", "llama_model", "sdpa_attention"]


# --- one decoding step with a KV cache, as the exporters write a decoder with past (static shapes) -------------


def decode_step(past: int, heads: int = 4, kv_heads: int = 2, hidden: int = 16, batch: int = 2, rope: bool = True,
                concat_axis: int = 2, theta: float = 10000.0, grouped_query: bool = False,
                mask_last: bool = False) -> onnx.ModelProto:
    """A decoder layer's attention for one new token after ``past`` cached ones: inputs ``hidden_states``
    [B, 1, E], ``attention_mask`` [B, P + 1] (int64) and ``past_key_values.0.key/value`` [B, KV, P, D];
    outputs the projected context and ``present.0.key/value`` = Concat(past, new) on ``concat_axis``
    (2 or -2).  Llama's eager form: RoPE by rotate-half with the tables at position P (static: initializers),
    repeat_kv when ``kv_heads < heads`` (``grouped_query``: the query reshaped to [B, KV, H / KV, D] instead, the
    context back to [B, H, 1, D], as sdpa exports GQA), (1 - mask) * min-float as the additive mask, written first
    or (``mask_last``) after the cache Concats, just before the scores read it (as the dynamo exporter writes the
    mask that all layers share in the first layer)."""
    m = OnnxBuilder(18)
    hd = hidden // heads
    total = past + 1
    x = m.input("hidden_states", F, [batch, 1, hidden])
    mask = m.input("attention_mask", TensorProto.INT64, [batch, total])
    past_k = m.input("past_key_values.0.key", F, [batch, kv_heads, past, hd])
    past_v = m.input("past_key_values.0.value", F, [batch, kv_heads, past, hd])
    angles = past / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    both = np.concatenate([angles, angles]).reshape(1, 1, 1, hd)
    cos, sin = (m.init(name, f(both).astype(np.float32)) for name, f in (("rope.cos", np.cos), ("rope.sin", np.sin)))

    def heads_of(t: str, n: int) -> str:
        return m.op("Transpose", [m.op("Reshape", [t, m.ints(batch, 1, n, hd)])], perm=[0, 2, 1, 3])

    def rotary(t: str) -> str:
        if not rope:
            return t
        first = m.op("Slice", [t, m.ints(0), m.ints(hd // 2), m.ints(3)])
        second = m.op("Slice", [t, m.ints(hd // 2), m.ints(2**62), m.ints(3)])
        rotated = m.op("Concat", [m.op("Neg", [second]), first], axis=-1)
        return m.op("Add", [m.op("Mul", [t, cos]), m.op("Mul", [rotated, sin])])

    def repeat_kv(t: str) -> str:
        if kv_heads == heads:
            return t
        grown = m.op("Expand", [m.op("Unsqueeze", [t, m.ints(2)]),
                                m.ints(batch, kv_heads, heads // kv_heads, total, hd)])
        return m.op("Reshape", [grown, m.ints(batch, heads, total, hd)])

    def additive_mask() -> str:
        dropped = m.op("Sub", [m.const(1.0), m.op("Cast", [mask], to=F)])
        return m.op("Mul", [m.op("Reshape", [dropped, m.ints(batch, 1, 1, total)]),
                            m.const(float(np.finfo(np.float32).min))])

    additive = None if mask_last else additive_mask()
    q = rotary(heads_of(m.linear(x, "q_proj", hidden, heads * hd), heads))
    k = rotary(heads_of(m.linear(x, "k_proj", hidden, kv_heads * hd), kv_heads))
    v = heads_of(m.linear(x, "v_proj", hidden, kv_heads * hd), kv_heads)
    present_k = m.op("Concat", [past_k, k], axis=concat_axis)
    present_v = m.op("Concat", [past_v, v], axis=concat_axis)
    additive = additive or additive_mask()
    if grouped_query:
        q = m.op("Reshape", [q, m.ints(batch, kv_heads, heads // kv_heads, hd)])
    keys = present_k if grouped_query else repeat_kv(present_k)
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [keys], perm=[0, 1, 3, 2])]), m.const(hd**-0.5)])
    probs = m.op("Softmax", [m.op("Add", [scores, additive])], axis=-1)
    ctx = m.op("MatMul", [probs, present_v if grouped_query else repeat_kv(present_v)])
    if grouped_query:
        ctx = m.op("Reshape", [ctx, m.ints(batch, heads, 1, hd)])
    merged = m.op("Reshape", [m.op("Transpose", [ctx], perm=[0, 2, 1, 3]), m.ints(batch, 1, hidden)])
    return m.model({"output": m.linear(merged, "o_proj", hidden, hidden), "present.0.key": present_k,
                    "present.0.value": present_v})

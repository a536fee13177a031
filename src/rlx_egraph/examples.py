"""Example models built only from primitive ops, in the forms a PyTorch -> ONNX export produces.

Norms, SiLU and GELU are decomposed exactly as the exporters write them (the
optimizer's rewrite rules recognise these forms); weights are ``[in, out]``
(``x @ W``) unless said otherwise.  Every builder returns a valid
:class:`Graph` with outputs set; :func:`synthetic` makes large random-ish DAGs
of the same patterns for scalability benchmarks.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

from .ir import Graph

SQRT_2 = 1.4142135623730951
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TANH_COEF = 0.044715


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise ValueError(problem)


# --- export-form patterns -----------------------------------------------------------


def _width(g: Graph, x: int) -> int:
    return g.node(x).shape[-1]


def _linear(g: Graph, x: int, prefix: str, n_out: int, bias: bool = True) -> int:
    """``x @ W`` (W ``[in, n_out]``), then ``+ b`` (b ``[n_out]``) when ``bias``."""
    y = g.matmul(x, g.param(f"{prefix}.weight", (_width(g, x), n_out)))
    return g.add(y, g.param(f"{prefix}.bias", (n_out,))) if bias else y


def _rms_norm(g: Graph, x: int, prefix: str, eps: float) -> int:
    """RMSNorm over the last axis: Pow 2, ReduceMean, Add eps, Rsqrt, Mul, Mul gamma."""
    m = g.reduce_mean(g.pow(x, g.scalar(2.0)), axes=(-1,), keepdims=True)
    r = g.rsqrt(g.add(m, g.scalar(eps)))
    return g.mul(g.mul(x, r), g.param(f"{prefix}.weight", (_width(g, x),)))


def _layer_norm(g: Graph, x: int, prefix: str, eps: float) -> int:
    """LayerNorm over the last axis: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta."""
    d = g.sub(x, g.reduce_mean(x, axes=(-1,), keepdims=True))
    var = g.reduce_mean(g.pow(d, g.scalar(2.0)), axes=(-1,), keepdims=True)
    n = g.div(d, g.sqrt(g.add(var, g.scalar(eps))))
    width = _width(g, x)
    return g.add(g.mul(n, g.param(f"{prefix}.weight", (width,))), g.param(f"{prefix}.bias", (width,)))


def _native_layer_norm(g: Graph, x: int, prefix: str, eps: float) -> int:
    """A LayerNorm node with gamma/beta parameters."""
    width = _width(g, x)
    return g.layer_norm(x, g.param(f"{prefix}.weight", (width,)), g.param(f"{prefix}.bias", (width,)), eps=eps)


def _silu(g: Graph, x: int) -> int:
    """SiLU as exported: ``Mul(x, Sigmoid(x))``."""
    return g.mul(x, g.sigmoid(x))


def _gelu_erf(g: Graph, x: int) -> int:
    """Exact GELU as exported: ``Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)``."""
    o = g.add(g.erf(g.div(x, g.scalar(SQRT_2))), g.scalar(1.0))
    return g.mul(g.mul(x, o), g.scalar(0.5))


def _gelu_tanh(g: Graph, x: int) -> int:
    """tanh-approximate GELU as exported: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    a = g.mul(g.pow(x, g.scalar(3.0)), g.scalar(GELU_TANH_COEF))
    t = g.tanh(g.mul(g.add(x, a), g.scalar(SQRT_2_OVER_PI)))
    return g.mul(g.mul(x, g.add(t, g.scalar(1.0))), g.scalar(0.5))


def _split_heads(g: Graph, x: int, heads: int) -> int:
    """``[B, S, heads*hd]`` -> Reshape ``[B, S, heads, hd]`` -> Transpose ``[B, heads, S, hd]``."""
    b, s, width = g.node(x).shape
    return g.transpose(g.reshape(x, shape=(b, s, heads, width // heads)), perm=(0, 2, 1, 3))


def _merge_heads(g: Graph, x: int) -> int:
    """``[B, H, S, hd]`` -> Transpose ``[B, S, H, hd]`` -> Reshape ``[B, S, H*hd]``."""
    b, h, s, hd = g.node(x).shape
    return g.reshape(g.transpose(x, perm=(0, 2, 1, 3)), shape=(b, s, h * hd))


def _token_embedding(g: Graph, ids: int, name: str, vocab: int, hidden: int) -> int:
    return g.embedding(g.param(name, (vocab, hidden)), ids)


# --- models -----------------------------------------------------------------------------


def mlp(layers: int = 3, hidden: int = 64, batch: int = 4, inp: int = 32, out: int = 10) -> Graph:
    """x ``[batch, inp]`` -> ``layers`` hidden layers of MatMul + Add bias + Relu -> MatMul + Add bias."""
    _require(layers >= 0, f"layers={layers} must be >= 0")
    g = Graph(f"mlp_L{layers}_H{hidden}")
    h = g.input("x", (batch, inp))
    for i in range(layers):
        h = g.relu(_linear(g, h, f"layers.{i}", hidden))
    g.set_outputs([_linear(g, h, "head", out)])
    return g


def _llama_attention(g: Graph, y: int, p: str, heads: int, kv_heads: int, theta: float) -> int:
    """q/k/v projections, split heads, RoPE on q and k, causal GQA attention, merge heads, o_proj."""
    hidden = _width(g, y)
    hd = hidden // heads
    q = _split_heads(g, _linear(g, y, f"{p}.q_proj", heads * hd, bias=False), heads)
    k = _split_heads(g, _linear(g, y, f"{p}.k_proj", kv_heads * hd, bias=False), kv_heads)
    v = _split_heads(g, _linear(g, y, f"{p}.v_proj", kv_heads * hd, bias=False), kv_heads)
    attn = g.causal_attention(g.rope(q, theta=theta), g.rope(k, theta=theta), v)
    return _linear(g, _merge_heads(g, attn), f"{p}.o_proj", hidden, bias=False)


def _llama_mlp(g: Graph, y: int, p: str, ffn: int) -> int:
    """SwiGLU MLP as exported: ``down(Mul(Mul(gate, Sigmoid(gate)), up))``."""
    gate = _linear(g, y, f"{p}.gate_proj", ffn, bias=False)
    up = _linear(g, y, f"{p}.up_proj", ffn, bias=False)
    return _linear(g, g.mul(_silu(g, gate), up), f"{p}.down_proj", _width(g, y), bias=False)


def llama(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128, seq: int = 16,
          batch: int = 2, vocab: int = 128, eps: float = 1e-6, theta: float = 10000.0) -> Graph:
    """A Llama decoder: pre-RMSNorm, GQA causal attention with RoPE, SwiGLU MLP, untied lm_head -> logits."""
    _require(layers >= 0, f"layers={layers} must be >= 0")
    _require(hidden % heads == 0, f"hidden={hidden} is not divisible by heads={heads}")
    _require(heads % kv_heads == 0, f"heads={heads} is not a multiple of kv_heads={kv_heads}")
    _require((hidden // heads) % 2 == 0, f"head_dim={hidden // heads} must be even for RoPE")
    g = Graph(f"llama_L{layers}_H{hidden}")
    x = _token_embedding(g, g.input("input_ids", (batch, seq), "i64"), "embed_tokens.weight", vocab, hidden)
    for i in range(layers):
        p = f"layers.{i}"
        y = _rms_norm(g, x, f"{p}.input_layernorm", eps)
        h = g.add(x, _llama_attention(g, y, f"{p}.self_attn", heads, kv_heads, theta))
        y = _rms_norm(g, h, f"{p}.post_attention_layernorm", eps)
        x = g.add(h, _llama_mlp(g, y, f"{p}.mlp", ffn))
    g.set_outputs([_linear(g, _rms_norm(g, x, "norm", eps), "lm_head", vocab, bias=False)])
    return g


def bert(layers: int = 2, hidden: int = 64, heads: int = 4, ffn: int = 256, seq: int = 8, batch: int = 2,
         vocab: int = 128, eps: float = 1e-12) -> Graph:
    """A post-norm BERT encoder with a [batch, seq] key mask -> final hidden states."""
    _require(layers >= 0, f"layers={layers} must be >= 0")
    _require(hidden % heads == 0, f"hidden={hidden} is not divisible by heads={heads}")
    g = Graph(f"bert_L{layers}_H{hidden}")
    ids = g.input("input_ids", (batch, seq), "i64")
    mask = g.input("attention_mask", (batch, seq))
    e = _token_embedding(g, ids, "embeddings.word_embeddings.weight", vocab, hidden)
    e = g.add(e, g.param("embeddings.position_embeddings.weight", (seq, hidden)))
    h = _layer_norm(g, e, "embeddings.LayerNorm", eps)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        q, k, v = (_linear(g, h, f"{p}.attention.self.{n}", hidden) for n in ("query", "key", "value"))
        attn = _linear(g, g.attention(q, k, v, mask, heads=heads, mask="custom"), f"{p}.attention.output.dense",
                       hidden)
        h1 = _layer_norm(g, g.add(attn, h), f"{p}.attention.output.LayerNorm", eps)
        inner = _gelu_erf(g, _linear(g, h1, f"{p}.intermediate.dense", ffn))
        h = _layer_norm(g, g.add(_linear(g, inner, f"{p}.output.dense", hidden), h1), f"{p}.output.LayerNorm", eps)
    g.set_outputs([h])
    return g


def _gpt2_attention(g: Graph, x: int, p: str, heads: int) -> int:
    """One c_attn projection, three Narrows into q/k/v, causal attention, c_proj."""
    hidden = _width(g, x)
    qkv = _linear(g, x, f"{p}.c_attn", 3 * hidden)
    q, k, v = (g.narrow(qkv, axis=-1, start=i * hidden, length=hidden) for i in range(3))
    return _linear(g, g.attention(q, k, v, heads=heads, mask="causal"), f"{p}.c_proj", hidden)


def gpt2(layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16, batch: int = 2, vocab: int = 128,
         eps: float = 1e-5) -> Graph:
    """A pre-norm GPT-2 decoder with native LayerNorm, tanh-GELU and an lm head tied to wte -> logits."""
    _require(layers >= 0, f"layers={layers} must be >= 0")
    _require(hidden % heads == 0, f"hidden={hidden} is not divisible by heads={heads}")
    g = Graph(f"gpt2_L{layers}_H{hidden}")
    wte = g.param("wte.weight", (vocab, hidden))
    x = g.add(g.embedding(wte, g.input("input_ids", (batch, seq), "i64")), g.param("wpe.weight", (seq, hidden)))
    for i in range(layers):
        p = f"h.{i}"
        x = g.add(x, _gpt2_attention(g, _native_layer_norm(g, x, f"{p}.ln_1", eps), f"{p}.attn", heads))
        inner = _gelu_tanh(g, _linear(g, _native_layer_norm(g, x, f"{p}.ln_2", eps), f"{p}.mlp.c_fc", 4 * hidden))
        x = g.add(x, _linear(g, inner, f"{p}.mlp.c_proj", hidden))
    g.set_outputs([g.matmul_bt(_native_layer_norm(g, x, "ln_f", eps), wte)])
    return g


def _conv(g: Graph, x: int, prefix: str, width: int) -> int:
    """3x3 Conv2d (stride 1, padding 1) + bias Param ``[width]`` reshaped to ``[1, width, 1, 1]``."""
    w = g.param(f"{prefix}.weight", (width, g.node(x).shape[1], 3, 3))
    bias = g.reshape(g.param(f"{prefix}.bias", (width,)), shape=(1, width, 1, 1))
    return g.add(g.conv2d(x, w, stride=1, padding=1), bias)


def _group_norm(g: Graph, x: int, prefix: str, groups: int) -> int:
    width = g.node(x).shape[1]
    return g.group_norm(x, g.param(f"{prefix}.weight", (width,)), g.param(f"{prefix}.bias", (width,)), groups=groups)


def conv_block(batch: int = 2, channels: int = 3, width: int = 16, size: int = 16, groups: int = 4,
               classes: int = 10) -> Graph:
    """Conv + GroupNorm + SiLU (decomposed), MaxPool, Conv + GroupNorm + Silu, Upsample, pool, classifier."""
    _require(size % 2 == 0, f"size={size} must be even (MaxPool2d halves it)")
    g = Graph(f"conv_block_W{width}_S{size}")
    h = _silu(g, _group_norm(g, _conv(g, g.input("x", (batch, channels, size, size)), "conv1", width), "norm1",
                             groups))
    h = g.max_pool2d(h, kernel=2, stride=2)
    h = g.silu(_group_norm(g, _conv(g, h, "conv2", width), "norm2", groups))
    g.set_outputs([_linear(g, g.global_avg_pool(g.upsample2x(h)), "fc", classes)])
    return g


ALL: dict[str, Callable[..., Graph]] = {"mlp": mlp, "llama": llama, "bert": bert, "gpt2": gpt2,
                                        "conv_block": conv_block}

# --- synthetic DAGs -------------------------------------------------------------------------

_SYN_SHAPE = (2, 8, 32)  # [batch, seq, hidden] of the synthetic residual stream
_SYN_HEADS = 2
_SYN_MAX_BLOCK = 35  # the largest block: decomposed LayerNorm + MLP with tanh-GELU + residual Add
_SYN_MIN_NODES = 2  # the input and one op
_SYN_ACTS: tuple[Callable[[Graph, int], int], ...] = (lambda g, x: g.relu(x), _silu, _gelu_erf, _gelu_tanh)


def _syn_norm(g: Graph, x: int, p: str, rng: random.Random) -> int:
    norm = rng.choice((_rms_norm, _layer_norm, _native_layer_norm))
    return norm(g, x, f"{p}.norm", 1e-5)


def _syn_mlp(g: Graph, y: int, p: str, rng: random.Random) -> int:
    """MatMul + bias + activation chain, back to the stream width."""
    act = rng.choice(_SYN_ACTS)
    return _linear(g, act(g, _linear(g, y, f"{p}.fc1", 2 * _width(g, y))), f"{p}.fc2", _width(g, y))


def _syn_swiglu(g: Graph, y: int, p: str, rng: random.Random) -> int:
    """The Llama SwiGLU MLP (shared-input gate/up matmuls), twice the stream width inside."""
    return _llama_mlp(g, y, p, 2 * _width(g, y))


def _syn_attention(g: Graph, y: int, p: str, rng: random.Random) -> int:
    """Three shared-input Linear projections into causal packed attention, then an output Linear."""
    q, k, v = (_linear(g, y, f"{p}.{n}_proj", _width(g, y)) for n in "qkv")
    return _linear(g, g.attention(q, k, v, heads=_SYN_HEADS, mask="causal"), f"{p}.out_proj", _width(g, y))


_SYN_BLOCKS = (_syn_mlp, _syn_swiglu, _syn_attention)


def _syn_fill(g: Graph, h: int, count: int) -> int:
    """Exactly ``count`` more nodes on ``h``: decomposed SiLUs (2 nodes each), then a Tanh if one is left."""
    for _ in range(count // 2):
        h = _silu(g, h)
    return g.tanh(h) if count % 2 else h


def synthetic(nodes: int = 20000, seed: int = 0) -> Graph:
    """A deterministic DAG of exactly ``nodes`` nodes mixing the models' patterns.

    A residual stream ``[2, 8, 32]`` goes through pre-norm blocks ``h + f(norm(h))``
    with the norm (decomposed RMS/LayerNorm or native LayerNorm) and ``f``
    (MatMul+bias+activation chain, SwiGLU with shared-input gate/up, shared-input
    q/k/v attention) drawn from ``random.Random(seed)``; a tail of decomposed
    SiLUs makes the count exact.  Every node reaches the single output.
    """
    _require(nodes >= _SYN_MIN_NODES, f"nodes={nodes} must be >= {_SYN_MIN_NODES}")
    rng = random.Random(seed)
    g = Graph(f"synthetic_N{nodes}_seed{seed}")
    h = g.input("x", _SYN_SHAPE)
    block = 0
    while nodes - len(g) > _SYN_MAX_BLOCK:
        p = f"blocks.{block}"
        h = g.add(h, rng.choice(_SYN_BLOCKS)(g, _syn_norm(g, h, p, rng), p, rng))
        block += 1
    g.set_outputs([_syn_fill(g, h, nodes - len(g))])
    return g


# The steps of a random graph (see random_graph): each appends one pattern built from earlier values.
RANDOM_STEPS = ("linear", "linear_gelu", "linear_silu", "silu_export", "residual", "layer_norm", "rms_export",
                "neg_neg", "mul_one", "swiglu", "shared_pair", "relu", "exp")
_RANDOM_WIDTH = 8
_RANDOM_MAX_PICK = 50  # a step's operands are earlier values picked by index modulo their count


def random_plan(rng: random.Random, max_steps: int = 10) -> list[tuple[str, int, int]]:
    """A plan for :func:`random_graph` drawn from ``rng``: 1 to ``max_steps`` steps, each with two operand picks."""
    return [(rng.choice(RANDOM_STEPS), rng.randint(0, _RANDOM_MAX_PICK), rng.randint(0, _RANDOM_MAX_PICK))
            for _ in range(rng.randint(1, max_steps))]


def random_graph(plan: Sequence[tuple[str, int, int]]) -> Graph:
    """A small graph of the rules' patterns, values all ``[4, 8]`` f32, from inputs ``x`` and ``y``: each
    ``(step, i, j)`` of ``plan`` (a step of :data:`RANDOM_STEPS`) appends one pattern over the earlier values
    ``i`` and ``j`` (modulo their count); the last two values are the outputs.  The property tests draw plans;
    ``python -m benchmarks.bench agreement`` compares the engines on seeded ones."""
    g = Graph("random")
    values = [g.input("x", (4, _RANDOM_WIDTH)), g.input("y", (4, _RANDOM_WIDTH))]
    square, row, numbers = (_RANDOM_WIDTH, _RANDOM_WIDTH), (_RANDOM_WIDTH,), itertools.count(1)

    def param(shape: tuple[int, ...]) -> int:
        return g.param(f"p{next(numbers)}", shape)

    for step, i, j in plan:
        _require(step in RANDOM_STEPS, f"unknown random-graph step {step!r}; steps: {', '.join(RANDOM_STEPS)}")
        a, b = values[i % len(values)], values[j % len(values)]
        if step.startswith("linear"):
            v = g.add(g.matmul(a, param(square)), param(row))
            v = g.gelu(v) if step == "linear_gelu" else g.silu(v) if step == "linear_silu" else v
        elif step == "silu_export":
            v = g.mul(a, g.sigmoid(a))
        elif step == "residual":
            v = g.add(a, b)
        elif step == "layer_norm":
            v = g.layer_norm(a, param(row), param(row))
        elif step == "rms_export":
            r = g.rsqrt(g.add(g.reduce_mean(g.pow(a, g.scalar(2.0)), axes=(-1,), keepdims=True), g.scalar(1e-6)))
            v = g.mul(g.mul(a, r), param(row))
        elif step == "neg_neg":
            v = g.neg(g.neg(a))
        elif step == "mul_one":
            v = g.mul(a, g.scalar(1.0))
        elif step == "swiglu":
            v = g.mul(g.silu(a), b)
        elif step == "shared_pair":
            v = g.add(g.matmul(a, param(square)), g.matmul(a, param(square)))
        elif step == "relu":
            v = g.relu(a)
        else:
            v = g.exp(g.mul(a, g.scalar(0.1)))
        values.append(v)
    g.set_outputs(values[-2:])
    return g


__all__ = ["ALL", "RANDOM_STEPS", "bert", "conv_block", "gpt2", "llama", "mlp", "random_graph", "random_plan",
           "synthetic"]

"""A fused op against its parts at one shape, predicted and measured: ``python benchmarks/fused_vs_parts.py``.

Whether the ``onnxruntime`` target takes a fusion is decided by the fused op's measured line against its parts'
at the model's shape.  This checks that decision: for each fused op the target runs as a pair of kernels or one
(FusedMatMulBiasAct with a GELU epilogue: MatMul + com.microsoft BiasGelu; without: Gemm; QkvAttention:
com.microsoft Attention with the packed Q/K/V weights; FusedResidualLN: com.microsoft SkipLayerNormalization;
EmbedLayerNorm of word and position embeddings: com.microsoft EmbedLayerNormalization, its ids cast to int32),
the graph of one fused node and the graph of its parts (MatMul, Add, Gelu; three Gemm projections and
MultiHeadAttention, the opset-23 Attention; Add, LayerNorm; Gather, Add, LayerNorm), each exported as
``export_model`` writes it and run in turn in onnxruntime (ORT_ENABLE_ALL, one thread, the thread's CPU time); it
prints both predictions, both measurements and whether the two agree on which is faster.  Default shape:
BERT-base's (batch 1, 128 tokens, hidden 768, FFN 3072, vocabulary 30522; heads of width 64, and of width 16 below
hidden 256, as in the corpus's tiny models).

    python benchmarks/fused_vs_parts.py [--batch 1] [--tokens 128] [--hidden 768] [--ffn 3072] [--vocab 30522]
        [--runs 40]

Needs the onnx extra.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np

from rlx_egraph import Graph
from rlx_egraph.cli.main import format_table
from rlx_egraph.cost import profile
from rlx_egraph.cost.profile import format_ns
from rlx_egraph.cost.targets import get_target
from rlx_egraph.onnx import measure_latencies


def _graph(name: str, build: Callable[[Graph, int], int], x_shape: tuple[int, ...], x_dtype: str = "f32") -> Graph:
    g = Graph(name)
    g.set_outputs([build(g, g.input("x", x_shape, x_dtype))])
    return g


def pairs(batch: int, tokens: int, hidden: int, ffn: int, vocab: int) -> dict[str, tuple[Graph, Graph]]:
    """Fused op -> (a graph of it, a graph of its parts), parameters without values (measured with random ones)."""
    x, mask = (batch, tokens, hidden), (batch, 1, 1, tokens)
    positions = np.random.default_rng(0).standard_normal((tokens, hidden)).astype(np.float32)
    heads = hidden // 64 if hidden >= 256 else max(hidden // 16, 1)  # BERT-base's head width 64; a tiny model's 16
    scale = (hidden // heads) ** -0.5

    def w(g: Graph, name: str, *shape: int) -> int:
        return g.param(name, shape)

    return {
        "FusedMatMulBiasAct gelu": (
            _graph("fused", lambda g, i: g.fused_matmul_bias_act(i, w(g, "w", hidden, ffn), w(g, "b", ffn),
                                                                 act="gelu"), x),
            _graph("parts", lambda g, i: g.gelu(g.add(g.matmul(i, w(g, "w", hidden, ffn)), w(g, "b", ffn))), x)),
        "FusedMatMulBiasAct none": (
            _graph("fused", lambda g, i: g.fused_matmul_bias_act(i, w(g, "w", hidden, hidden), w(g, "b", hidden)), x),
            _graph("parts", lambda g, i: g.add(g.matmul(i, w(g, "w", hidden, hidden)), w(g, "b", hidden)), x)),
        "QkvAttention (packed QKV)": (
            _graph("fused", lambda g, i: g.qkv_attention(i, w(g, "w", hidden, 3 * hidden), w(g, "b", 3 * hidden),
                                                          g.input("mask", mask), heads=heads, scale=scale), x),
            _graph("parts", lambda g, i: g.multi_head_attention(
                *(g.fused_matmul_bias_act(i, w(g, f"w{p}", hidden, hidden), w(g, f"b{p}", hidden)) for p in "qkv"),
                g.input("mask", mask), heads=heads, scale=scale), x)),
        "FusedResidualLN": (
            _graph("fused", lambda g, i: g.fused_residual_ln(i, g.input("r", x), w(g, "g", hidden),
                                                             w(g, "b", hidden)), x),
            _graph("parts", lambda g, i: g.layer_norm(g.add(i, g.input("r", x)), w(g, "g", hidden),
                                                      w(g, "b", hidden)), x)),
        "EmbedLayerNorm (word + positions)": (  # DistilBERT's embeddings: no token-type term
            _graph("fused", lambda g, i: g.embed_layer_norm(w(g, "table", vocab, hidden), i, g.constant(positions),
                                                            w(g, "g", hidden), w(g, "b", hidden)), (batch, tokens),
                   "i64"),
            _graph("parts", lambda g, i: g.layer_norm(g.add(g.embedding(w(g, "table", vocab, hidden), i),
                                                            g.constant(positions)), w(g, "g", hidden),
                                                      w(g, "b", hidden)), (batch, tokens), "i64")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--ffn", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=30522, help="rows of the embedding table")
    parser.add_argument("--runs", type=int, default=40, help="runs of each graph (in turn)")
    args = parser.parse_args(argv)
    target = get_target("onnxruntime")
    print(f"priced by: {target.calibration}")
    rows = []
    for name, (fused, parts) in pairs(args.batch, args.tokens, args.hidden, args.ffn, args.vocab).items():
        predicted = [profile(g, target).ns for g in (fused, parts)]
        measured = [m.fastest_ns for m in measure_latencies([fused, parts], runs=args.runs, budget_s=0.0)]
        agree = (predicted[0] < predicted[1]) == (measured[0] < measured[1])
        rows.append((name, *map(format_ns, predicted), f"{predicted[0] / predicted[1]:.3f}", *map(format_ns, measured),
                     f"{measured[0] / measured[1]:.3f}", "yes" if agree else "no"))
    print(format_table(("fused op", "predicted: fused", "parts", "fused / parts", "measured (fastest): fused",
                        "parts", "fused / parts", "agree"), rows, "<>>>>>><"))
    print(f"shape: batch {args.batch}, {args.tokens} tokens, hidden {args.hidden}, FFN {args.ffn}; "
          f"load average (1 min): {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Side-by-side comparison with onnxruntime's optimizers: ``python -m rlx_egraph.frontends.onnx.compare DIR``.

For every ``*.onnx`` in DIR: node count, kernel launches (nodes other than layout ops) and fused-op counts of
the original, onnxruntime's transformer optimizer at opt_level 0, 1 and 99, onnxruntime's own ORT_ENABLE_ALL
graph, and ours (import, optimize for the onnxruntime target, export); then the onnxruntime CPU latency (one
thread, median of ``--runs`` runs after warm-up) of the original, the transformer optimizer's fastest output
and ours, with ratios to the original.  Symbolic dims are bound by ``--dim name=value`` (batch=2,
sequence=16 by default).  Needs onnx and onnxruntime (not torch).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

# Ops that move or relabel data without a kernel of their own.
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Constant",
                        "Shape"})
# Standard ops that are fusions in their own right (com.microsoft ops all count as fused).
FUSED_STANDARD_OPS = frozenset({"LayerNormalization", "RMSNormalization", "Gelu", "Attention",
                                "RotaryEmbedding", "Gemm"})
# The transformer optimizer's model_type by file-name prefix (the rest: "bert").
MODEL_TYPES = {"gpt2": "gpt2", "llama": "gpt2", "t5": "t5", "vit": "vit", "bert": "bert", "sdpa": "bert"}


def op_counts(model: onnx.ModelProto) -> tuple[int, int, Counter[str]]:
    """(nodes, kernel launches, fused ops by type) of ``model``'s main graph."""
    nodes = model.graph.node
    launches = sum(1 for n in nodes if n.op_type not in LAYOUT_OPS)
    fused = Counter(n.op_type for n in nodes if n.domain == "com.microsoft" or n.op_type in FUSED_STANDARD_OPS)
    return len(nodes), launches, fused


def input_shapes(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Static shapes of the graph inputs (initializers excluded), symbolic dims bound by ``dims``."""
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for info in model.graph.input:
        if info.name in inits:
            continue
        shape = []
        for d in info.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in dims:
                shape.append(dims[d.dim_param])
            else:
                raise SystemExit(f"input {info.name!r}: dim {d.dim_param or '(unnamed)'!r} is not bound; "
                                 "pass --dim NAME=VALUE")
        out[info.name] = tuple(shape)
    return out


def feeds(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Seeded inputs: floats normal, integer ids/masks of ones (a 0/1 attention mask keeps every key)."""
    rng = np.random.default_rng(0)
    out = {}
    for info in model.graph.input:
        if info.name not in shapes:
            continue
        np_dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        shape = shapes[info.name]
        out[info.name] = (rng.standard_normal(shape).astype(np_dtype) if np.issubdtype(np_dtype, np.floating)
                          else np.ones(shape, np_dtype))
    return out


def session(model: onnx.ModelProto | str, level: str = "ORT_DISABLE_ALL", save: str | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if save:
        opts.optimized_model_filepath = save
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def latency_ms(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], runs: int) -> float:
    """Median wall time of one run on one CPU thread after 10 warm-up runs (graph optimizations at basic)."""
    sess = session(model, "ORT_ENABLE_BASIC")
    for _ in range(10):
        sess.run(None, dict(inputs))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, dict(inputs))
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def variants(path: Path, shapes: dict[str, tuple[int, ...]], work: Path) -> dict[str, onnx.ModelProto | str]:
    """The original and every optimizer's output by label; a string says why that optimizer gave none."""
    from onnxruntime.transformers.optimizer import optimize_model

    from ...optimize import optimize
    from .exporter import export_model
    from .importer import import_model

    original = onnx.load(str(path))
    out: dict[str, onnx.ModelProto | str] = {"original": original}
    model_type = MODEL_TYPES.get(path.stem.split("_")[0].lower(), "bert")
    for level in (0, 1, 99):
        try:
            out[f"ort-transformers-{level}"] = optimize_model(
                str(path), model_type=model_type, num_heads=0, hidden_size=0, opt_level=level, use_gpu=False).model
        except ImportError as exc:  # its shape inference needs sympy, which onnxruntime does not install
            out[f"ort-transformers-{level}"] = f"unavailable: {exc}"
    saved = work / f"{path.stem}.ort_all.onnx"
    session(str(path), "ORT_ENABLE_ALL", str(saved))
    out["ort-enable-all"] = onnx.load(str(saved))
    out["ours"] = export_model(optimize(import_model(original, shapes), target="onnxruntime"))
    return out


def compare(folder: Path, dims: Mapping[str, int], runs: int = 100) -> str:
    """The comparison table of every model in ``folder``."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(folder.glob("*.onnx")):
            original = onnx.load(str(path))
            shapes = input_shapes(original, dims)
            models = variants(path, shapes, Path(tmp))
            lines.append(f"== {path.name}  inputs {shapes}")
            lines.append(f"  {'variant':<22}{'nodes':>6}{'launches':>9}  fused ops")
            for label, model in models.items():
                if isinstance(model, str):
                    lines.append(f"  {label:<22}{model}")
                    continue
                nodes, launches, fused = op_counts(model)
                listing = ", ".join(f"{op} x{k}" for op, k in sorted(fused.items())) or "-"
                lines.append(f"  {label:<22}{nodes:>6}{launches:>9}  {listing}")
            inputs = feeds(original, shapes)
            timed = {label: latency_ms(model, inputs, runs) for label, model in models.items()
                     if not isinstance(model, str) and (label in ("original", "ours") or "transformers" in label)}
            base = timed["original"]
            best = min((k for k in timed if "transformers" in k), key=timed.__getitem__, default=None)
            theirs = f"{best} {timed[best]:.3f} ms = {base / timed[best]:.2f}x" if best else "unavailable"
            lines.append(f"  latency (1 thread, median of {runs} runs): original {base:.3f} ms; best transformer "
                         f"optimizer: {theirs}; ours {timed['ours']:.3f} ms = {base / timed['ours']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlx_egraph.frontends.onnx.compare", description=__doc__)
    parser.add_argument("folder", type=Path, help="a folder of .onnx models")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="bind a symbolic dim")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per model (default 100)")
    args = parser.parse_args(argv)
    dims = {"batch": 2, "sequence": 16} | {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    print(compare(args.folder, dims, args.runs))


if __name__ == "__main__":
    main()

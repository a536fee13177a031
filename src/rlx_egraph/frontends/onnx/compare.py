"""Side-by-side comparison with onnxruntime's optimizers: ``python -m rlx_egraph.frontends.onnx.compare DIR``.

For every ``*.onnx`` in DIR, in one run: nodes, kernel launches and fused ops of the original, onnxruntime's
transformer optimizer at opt_level 0, 1 and 99, onnxruntime's own ORT_ENABLE_ALL graph, and ours (import,
optimize for the onnxruntime target with the ONNX rules, export); then the onnxruntime CPU latency (one thread,
median of ``--runs`` runs after 10 warm-up runs, the variants run in turn) of the original, the transformer
optimizer's fastest output and ours, each in a session at ORT_ENABLE_BASIC (the graph as written, constants
folded) and at ORT_ENABLE_ALL (what a default session does to it); the parity of ours (largest difference
from the original's output in onnxruntime, relative to the largest magnitude of that output) and our
import + optimize + export seconds.

The transformer optimizer (``onnxruntime.transformers.optimizer``) needs sympy, which onnxruntime does not
install, so it runs as a subprocess under ``--ort-python`` (default: this interpreter): any Python with
onnxruntime and sympy.  Symbolic dims are bound by ``--dim NAME=VALUE`` (batch=2, sequence=16 by default).
Needs onnx and onnxruntime (never torch).  The corpus of ``scripts/export_hf_models.py`` is compared by
``benchmarks/corpus.py`` (docs/corpus.md), which uses this module's counts and inputs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ...optimize import optimize
from .exporter import export_model
from .importer import import_model
from .rules import onnx_rules

# Ops that onnxruntime runs without a kernel touching the data (views, or folded at load): not launches.
ALIAS_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Constant"})
# Default-domain ops that are fusions in their own right (com.microsoft ops all count as fused);
# SimplifiedLayerNormalization (RMSNorm) is an onnxruntime contrib op registered in the default domain.
FUSED_STANDARD_OPS = frozenset({"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "Gelu",
                                "Attention", "RotaryEmbedding", "Gemm"})
# The transformer optimizer's model_type by file-name prefix (others: "bert").  LLaMA goes as "gpt2", as
# onnxruntime's own LLaMA export script does.
MODEL_TYPES = {"bert": "bert", "gpt2": "gpt2", "llama": "gpt2", "t5": "t5", "vit": "vit"}
TRANSFORMER_LEVELS = (0, 1, 99)
SESSION_LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL")
DIMS = {"batch": 2, "sequence": 16}  # the symbolic dims of the exports, unless --dim binds them otherwise


def op_counts(model: onnx.ModelProto) -> tuple[int, int, Counter[str]]:
    """(nodes, kernel launches, fused ops by type) of ``model``'s main graph."""
    nodes = model.graph.node
    launches = sum(1 for n in nodes if n.op_type not in ALIAS_OPS)
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


def feeds(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], max_id: int) -> dict[str, np.ndarray]:
    """Seeded inputs: floats normal; integer inputs named ``*mask*`` ones with the last key of every batch row
    but the first dropped (so padding is exercised); other integers (ids) uniform in [0, max_id)."""
    rng = np.random.default_rng(0)
    out = {}
    for info in model.graph.input:
        if info.name not in shapes:
            continue
        np_dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        shape = shapes[info.name]
        if np.issubdtype(np_dtype, np.floating):
            out[info.name] = rng.standard_normal(shape).astype(np_dtype)
        elif "mask" in info.name.lower():
            mask = np.ones(shape, np_dtype)
            mask[1:, ..., -1] = 0
            out[info.name] = mask
        else:
            out[info.name] = rng.integers(0, max_id, shape).astype(np_dtype)
    return out


def session(model: onnx.ModelProto | Path, level: str, save: Path | None = None):
    """A one-thread onnxruntime CPU session at graph optimization ``level`` (saving its graph to ``save``)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if save:
        opts.optimized_model_filepath = str(save)
    data = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def latency_ms(models: Mapping[str, onnx.ModelProto], inputs: Mapping[str, np.ndarray], runs: int,
               level: str) -> dict[str, float]:
    """Median wall time (ms) of one run of each model on one CPU thread after 10 warm-up runs.  The models run
    in turn, one run each per round, so that a change in the machine's load hits all of them alike."""
    sessions = {label: session(model, level) for label, model in models.items()}
    for sess in sessions.values():
        for _ in range(10):
            sess.run(None, dict(inputs))
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(runs):
        for label, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, dict(inputs))
            times[label].append(time.perf_counter() - t0)
    return {label: 1e3 * statistics.median(t) for label, t in times.items()}


def transformer_optimizer(path: Path, level: int, out: Path, python: str, heads: int,
                          hidden: int) -> onnx.ModelProto | str:
    """onnxruntime's transformer optimizer on ``path`` at ``level`` under ``python``; a string says why not."""
    model_type = MODEL_TYPES.get(path.stem.split("_")[0].lower(), "bert")
    cmd = [python, "-m", "onnxruntime.transformers.optimizer", "--input", str(path), "--output", str(out),
           "--model_type", model_type, "--opt_level", str(level), "--num_heads", str(heads),
           "--hidden_size", str(hidden)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"failed: cannot run {python}: {exc.strerror}"
    if run.returncode:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        return f"failed ({model_type}): {lines[-1] if lines else f'exit status {run.returncode}'}"
    return onnx.load(str(out))


@dataclass
class Result:
    """One model's comparison: every variant (or why it is missing), latencies, parity and our time."""

    name: str
    shapes: dict[str, tuple[int, ...]]
    variants: dict[str, onnx.ModelProto | str]
    seconds: float
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # session level -> label -> ms
    best: str | None = None
    parity: float = float("nan")


def run_model(path: Path, dims: Mapping[str, int], work: Path, runs: int, python: str, heads: int,
              hidden: int, max_id: int, rules: object) -> Result:
    """Every variant of the model at ``path``, timed and checked."""
    original = onnx.load(str(path))
    shapes = input_shapes(original, dims)
    variants: dict[str, onnx.ModelProto | str] = {"original": original}
    for level in TRANSFORMER_LEVELS:
        variants[f"ort-transformers-{level}"] = transformer_optimizer(
            path, level, work / f"{path.stem}.tf{level}.onnx", python, heads, hidden)
    saved = work / f"{path.stem}.ort_all.onnx"
    session(original, "ORT_ENABLE_ALL", saved)  # from memory: its weights are saved inline
    variants["ort-enable-all"] = onnx.load(str(saved))
    t0 = time.perf_counter()
    variants["ours"] = export_model(optimize(import_model(original, shapes), target="onnxruntime", rules=rules))
    result = Result(path.name, shapes, variants, time.perf_counter() - t0)
    inputs = feeds(original, shapes, max_id)
    timed = {k: v for k, v in variants.items() if not isinstance(v, str) and k != "ort-enable-all"}
    for level in SESSION_LEVELS:
        result.latency[level] = latency_ms(timed, inputs, runs, level)
    basic = result.latency["ORT_ENABLE_BASIC"]
    result.best = min((k for k in basic if k.startswith("ort-transformers")), key=basic.__getitem__, default=None)
    want = session(original, "ORT_ENABLE_BASIC").run(None, inputs)[0]
    got = session(variants["ours"], "ORT_ENABLE_BASIC").run(None, inputs)[0]
    result.parity = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30)) \
        if got.shape == want.shape else float("inf")
    return result


def _cell(model: onnx.ModelProto | str) -> str:
    if isinstance(model, str):
        return "-"
    nodes, launches, _ = op_counts(model)
    return f"{nodes} / {launches}"


def _fused(model: onnx.ModelProto | str) -> str:
    if isinstance(model, str):
        return model.replace("|", "\\|")
    fused = op_counts(model)[2]
    return ", ".join(f"{op} {k}" for op, k in sorted(fused.items())) or "none"


def table(results: list[Result], runs: int) -> str:
    """The three markdown tables: counts, latency, fused ops."""
    labels = list(results[0].variants) if results else []
    short = {"original": "original", "ours": "ours", "ort-enable-all": "ORT_ENABLE_ALL",
             **{f"ort-transformers-{k}": f"transformers {k}" for k in TRANSFORMER_LEVELS}}
    out = ["### Nodes / kernel launches", "",
           "| model | " + " | ".join(short[k] for k in labels) + " | ours: import+optimize+export s |",
           "|---" * (len(labels) + 2) + "|"]
    out += [f"| {r.name} | " + " | ".join(_cell(r.variants[k]) for k in labels) + f" | {r.seconds:.2f} |"
            for r in results]
    out += ["", f"### onnxruntime CPU latency, ms (1 thread, median of {runs} runs); speed-up over the original",
            "", "| model | session | original | best transformers (level) | ours | transformers x | ours x | "
            "ours vs best transformers | parity of ours |", "|---" * 9 + "|"]
    for r in results:
        for level in SESSION_LEVELS:
            ms = r.latency[level]
            base, ours = ms["original"], ms["ours"]
            best = f"{ms[r.best]:.3f} ({r.best.rsplit('-', 1)[1]})" if r.best else "-"
            theirs = f"{base / ms[r.best]:.2f}" if r.best else "-"
            versus = f"{ms[r.best] / ours:.2f}" if r.best else "-"
            out.append(f"| {r.name} | {level.removeprefix('ORT_ENABLE_')} | {base:.3f} | {best} | {ours:.3f} | "
                       f"{theirs} | {base / ours:.2f} | {versus} | {r.parity:.1e} |")
    out += ["", "### Fused ops", "", "| model | " + " | ".join(short[k] for k in labels[1:]) + " |",
            "|---" * len(labels) + "|"]
    out += [f"| {r.name} | " + " | ".join(_fused(r.variants[k]) for k in labels[1:]) + " |" for r in results]
    return "\n".join(out)


def compare(folder: Path, dims: Mapping[str, int], runs: int = 100, python: str = sys.executable, heads: int = 0,
            hidden: int = 0, max_id: int = 100, progress: bool = False) -> str:
    """The comparison tables of every model in ``folder`` (markdown)."""
    rules = onnx_rules()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(folder.glob("*.onnx")):
            results.append(run_model(path, dims, Path(tmp), runs, python, heads, hidden, max_id, rules))
            if progress:
                print(f"done {path.name}", file=sys.stderr, flush=True)
    shapes = sorted({str(r.shapes) for r in results})
    return "\n".join([f"Inputs: {'; '.join(shapes)}.", "", table(results, runs)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlx_egraph.frontends.onnx.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a folder of .onnx models")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="bind a symbolic dim")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per model and session (default 100)")
    parser.add_argument("--ort-python", default=sys.executable,
                        help="the Python (with onnxruntime and sympy) that runs the transformer optimizer")
    parser.add_argument("--num-heads", type=int, default=0, help="for the transformer optimizer (0: detect)")
    parser.add_argument("--hidden-size", type=int, default=0, help="for the transformer optimizer (0: detect)")
    parser.add_argument("--max-id", type=int, default=100, help="integer id inputs are drawn from [0, max-id)")
    args = parser.parse_args(argv)
    dims = DIMS | {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    print(compare(args.folder, dims, args.runs, args.ort_python, args.num_heads, args.hidden_size, args.max_id,
                  progress=True))


if __name__ == "__main__":
    main()

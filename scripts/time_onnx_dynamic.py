"""Import + optimize + export of ONNX models with their dynamic axes kept (no bindings), in seconds per phase (the
best of ``--repeat`` runs), with the fused ops and onnxruntime parity against the original at two shapes.

Without model files it times the test suite's exporter forms (tests/onnx_models.py, ``--layers`` layers, hidden 16):
BERT, GPT-2 and Llama as TorchScript and dynamo write them.

    .venv/bin/python scripts/time_onnx_dynamic.py [--layers 2] [--repeat 3] [MODEL.onnx ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from rlx_egraph import optimize
from rlx_egraph.onnx import export_model, import_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from onnx_models import bert_model, dynamic_feeds, gpt2_model, llama_model

SHAPES = ({"batch": 1, "sequence": 7}, {"batch": 3, "sequence": 17})


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def fused(graph) -> str:
    counts = Counter(n.op for n in graph.nodes if n.op.startswith(("Fused", "EmbedLayerNorm"))
                     or n.op.endswith("Attention"))
    return ", ".join(f"{op} {k}" for op, k in sorted(counts.items()))


def time_one(name: str, model: onnx.ModelProto, repeat: int) -> None:
    best: dict[str, float] = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        graph = import_model(model)
        t1 = time.perf_counter()
        optimized = optimize(graph, target="onnxruntime")
        t2 = time.perf_counter()
        exported = export_model(optimized)
        t3 = time.perf_counter()
        for phase, seconds in (("import", t1 - t0), ("optimize", t2 - t1), ("export", t3 - t2), ("total", t3 - t0)):
            best[phase] = min(best.get(phase, seconds), seconds)
    parity = []
    for binding in SHAPES:
        inputs = dynamic_feeds(model, binding)
        want = run(model, inputs)
        parity.append(float(np.abs(run(exported, inputs) - want).max() / max(float(np.abs(want).max()), 1e-30)))
    print(f"| {name} | {', '.join(graph.symbols)} | {best['import']:.3f} | {best['optimize']:.3f} | "
          f"{best['export']:.3f} | {best['total']:.3f} | {fused(optimized)} | "
          f"{' / '.join(f'{p:.1e}' for p in parity)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="ONNX files (default: the test suite's exporter forms)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.models:
        models = {path.name: onnx.load(path) for path in args.models}
    else:
        models = {f"{name} {exporter}": build(exporter, layers=args.layers)
                  for name, build in (("bert", bert_model), ("gpt2", gpt2_model), ("llama", llama_model))
                  for exporter in ("torchscript", "dynamo")}
    shapes = " / ".join(f"({b['batch']}, {b['sequence']})" for b in SHAPES)
    print(f"| model | symbols | import s | optimize s | export s | total s | fused ops | parity at {shapes} |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in models.items():
        time_one(name, model, args.repeat)


if __name__ == "__main__":
    main()

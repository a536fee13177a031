"""Predicted against measured latency on the ``onnxruntime`` target: ``python benchmarks/predict_latency.py``.

For every model, the graph as given (``input``) and as optimized for ``onnxruntime`` (``optimized``): the cost
model's predictions, priced by this machine's calibration if ``rlx-egraph calibrate`` made one, else the shipped
one (``profile``: the graph's ``IoProfile.ns``; ``export``: ``rlx_egraph.onnx.price_export``, the export as
onnxruntime dispatches it, its run-time shape nodes included) and the latency measured in onnxruntime
(``rlx_egraph.onnx.measure_latencies``:
the exported graph at ORT_ENABLE_ALL, one thread, the median and the fastest of the runs by the thread's CPU time;
the two graphs run in turn), and the prediction over the fastest run (the calibration keeps each sample's fastest
pass; on a shared machine the median moves with the other jobs' load); per size and graph, how many are within
1.5x.  Models: the example models
(``rlx_egraph.examples``) and the ``onnx.helper`` export-form layers of the test suite (``tests/onnx_models.py``),
each at a tiny size (hidden 64, or the tests' 16) and a real one (BERT-base: 12 layers, hidden 768, sequence 128),
and the exports of each ``--corpus`` folder: those its ``corpus.json`` lists (``scripts/export_hf_models.py``),
each bound at its first example shape (``--keep-dims``: imported with its symbolic dims, as the corpus comparison
imports it, priced at its hints) and named with its half (dev or held out), else its ``*.onnx`` files.

    python benchmarks/predict_latency.py --sizes --corpus CORPUS/tiny --corpus CORPUS/real --graphs optimized

Needs the onnx extra.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.cli.main import format_table
from rlx_egraph.cost import calibration as cal
from rlx_egraph.cost.profile import format_ns
from rlx_egraph.cost.targets import get_target, onnxruntime_target
from rlx_egraph.onnx import import_model, measure_latencies, onnx_rules, price_export

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import onnx_models  # the test suite's onnx.helper models

REAL = {"layers": 12, "hidden": 768, "heads": 12, "seq": 128, "batch": 1}
EXAMPLES: dict[str, dict[str, Callable[[], Graph]]] = {
    "tiny": {
        "mlp": lambda: examples.mlp(),
        "bert": lambda: examples.bert(layers=2, hidden=64, heads=4, ffn=256, seq=16, batch=2),
        "gpt2": lambda: examples.gpt2(layers=2, hidden=64, heads=4, seq=16, batch=2),
        "llama": lambda: examples.llama(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, seq=16, batch=2),
    },
    "real": {
        "bert": lambda: examples.bert(**REAL, ffn=3072, vocab=30522),
        "gpt2": lambda: examples.gpt2(**REAL, vocab=50257),
        "llama": lambda: examples.llama(layers=4, hidden=2048, heads=16, kv_heads=4, ffn=5632, seq=128, batch=1,
                                        vocab=32000),
    },
}
HELPER = {  # (builder keyword arguments, input shapes) per size
    "tiny": {"bert": ({}, {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}),
             "gpt2": ({}, {"hidden_states": (2, 5, 16)}),
             "llama": ({}, {"hidden_states": (2, 5, 16)}),
             "sdpa": ({}, {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)})},
    "real": {"bert": ({"hidden": 768, "heads": 12, "ffn": 3072}, {"hidden_states": (1, 128, 768),
                                                                  "attention_mask": (1, 128)}),
             "gpt2": ({"hidden": 768, "heads": 12, "max_positions": 128}, {"hidden_states": (1, 128, 768)}),
             "llama": ({"hidden": 2048, "heads": 16, "kv_heads": 4, "ffn": 5632}, {"hidden_states": (1, 128, 2048)}),
             "sdpa": ({"hidden": 768, "heads": 12}, {"hidden_states": (1, 128, 768), "attention_mask": (1, 128)})},
}
GRAPHS = ("input", "optimized")
PROBE_NODES = (10, 410)
PROBE_RUNS = 200  # the probe's median of this many runs each (some 30 ms in all)


def _chain(nodes: int) -> Graph:
    """A chain of Sigmoid nodes on one float: the calibration's dispatch probe."""
    g = Graph("probe")
    x = g.input("x", (1,))
    for _ in range(nodes):
        x = g.sigmoid(x)
    g.set_outputs([x])
    return g


PROBE = [_chain(n) for n in PROBE_NODES]
WITHIN = 1.5  # the target: predicted / measured within 1.5x either way
DIMS = {"batch": 2, "sequence": 16}  # the corpus exports' symbolic dims, unless --dim binds them otherwise


Build = Callable[[], tuple[Graph, object, dict[str, int]]]  # -> (graph, rules, symbolic dims' sizes)


def models(sizes: list[str], corpora: list[Path], dims: dict[str, int],
           keep_dims: bool = False) -> Iterator[tuple[str, str, Build]]:
    """(name, size, build); ``keep_dims``: a corpus export keeps its symbolic dims, run at its first example
    shape and priced at its hints."""
    for size in sizes:
        for name, build in EXAMPLES[size].items():
            yield f"example {name}", size, lambda build=build: (build(), None, {})
        for name, (kwargs, shapes) in HELPER[size].items():
            yield f"helper {name}", size, lambda name=name, kwargs=kwargs, shapes=shapes: (
                import_model(onnx_models.MODELS[name](**kwargs), shapes), onnx_rules(), {})
    for corpus in corpora:
        listed = corpus / "corpus.json"
        if listed.is_file():  # a corpus of scripts/export_hf_models.py: each export at its first example shape
            for entry in json.loads(listed.read_text())["exports"]:
                path, shapes = corpus / entry["file"], {k: tuple(v) for k, v in entry["shapes"][0].items()}
                half = "held out" if entry["held_out"] else "dev"
                hints = entry["hints"] if keep_dims else {}
                yield f"{Path(entry['file']).stem} ({half})", entry["size"], lambda path=path, shapes=shapes, \
                    hints=hints: (import_model(path, None if hints else shapes), onnx_rules(), hints)
            continue
        for path in sorted(corpus.glob("*.onnx")):
            yield f"corpus {path.stem}", corpus.name, lambda path=path: (import_model(path, _bindings(path, dims)),
                                                                         onnx_rules(), {})


def _bindings(path: Path, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The static shape of each graph input of the model at ``path``, its symbolic dims bound by ``dims``."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    shapes = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        unbound = [d.dim_param for d in i.type.tensor_type.shape.dim
                   if not d.HasField("dim_value") and d.dim_param not in dims]
        if unbound:
            raise ValueError(f"input {i.name}: dims {unbound} are not bound; pass --dim NAME=VALUE")
        shapes[i.name] = tuple(d.dim_value if d.HasField("dim_value") else dims[d.dim_param]
                               for d in i.type.tensor_type.shape.dim)
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", choices=["tiny", "real"], default=["tiny", "real"],
                        help="sizes of the example and helper models (none: only --corpus)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="models whose name contains one of these")
    parser.add_argument("--corpus", type=Path, action="append", default=[],
                        help="a folder of *.onnx exports to run as well (repeatable); a folder with a corpus.json "
                             "(scripts/export_hf_models.py) runs each export at its first example shape")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help=f"bind a symbolic dim of the corpus exports (default: {DIMS})")
    parser.add_argument("--cache", help="read the calibration from this cache directory")
    parser.add_argument("--runs", type=int, default=30, help="runs per graph at tiny size (real size: a fifth)")
    parser.add_argument("--graphs", nargs="+", choices=GRAPHS, default=list(GRAPHS),
                        help="which graphs of each model to measure (default: both)")
    parser.add_argument("--keep-dims", action="store_true",
                        help="import a corpus export with its symbolic dims (as the corpus comparison does), price it "
                             "at its hints and run it at its first example shape")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    target = onnxruntime_target(cal.load("onnxruntime", args.cache)) if args.cache else get_target("onnxruntime")
    print(f"priced by: {target.calibration}", flush=True)
    rows: list[tuple[str, ...]] = []
    ratios: dict[tuple[str, str, str], list[float]] = {}  # (size, graph, prediction) -> predicted / measured
    dims = {**DIMS, **{k: int(v) for k, _, v in (d.partition("=") for d in args.dim)}}
    for name, size, build in models(args.sizes, args.corpus, dims, args.keep_dims):
        if args.only and not any(key in name for key in args.only):
            continue
        start = time.perf_counter()
        try:
            graph, rules, hints = build()
            optimized, report = optimize_with_report(graph, target, rules=rules, dim_hints=hints or None)
            runs = max(3, args.runs // 5) if size == "real" else args.runs
            graphs = {"input": (graph, report.profile_before), "optimized": (optimized, report.profile_after)}
            graphs = {which: graphs[which] for which in args.graphs}
            priced = [price_export(g, profile.target) for g, profile in graphs.values()]
            measured = measure_latencies([g for g, _ in graphs.values()], runs=runs, budget_s=0.0, dims=hints)
            # the machine's state right after: a Sigmoid node on one float, measured as calibrated
            short, long = measure_latencies(PROBE, runs=PROBE_RUNS, budget_s=0.0)
            slowdown = (long.ns - short.ns) / (PROBE_NODES[1] - PROBE_NODES[0]) / target.dispatch_ns
        except Exception as exc:  # a model that cannot be run is a row saying why, not the end of the table
            rows.append((name, size, "-", "-", "-", "-", "-", "-", "-", f"{type(exc).__name__}: {exc}"[:60], "-"))
            print(f"{name} {size}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        for (which, (_, profile)), export, latency in zip(graphs.items(), priced, measured, strict=True):
            fastest = latency.fastest_ns
            ratios.setdefault((size, which, "profile"), []).append(profile.ns / fastest)
            ratios.setdefault((size, which, "export"), []).append(export.ns / fastest)
            rows.append((name, size, which, str(profile.launches), str(export.nodes), format_ns(profile.ns),
                         format_ns(export.ns), format_ns(latency.ns), format_ns(fastest),
                         f"{profile.ns / fastest:.2f} / {export.ns / fastest:.2f}", f"{slowdown:.2f}"))
        print(f"{name} {size}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    header = ("model", "size", "graph", "launches", "export nodes", "predicted: profile", "export",
              "measured (median)", "fastest", "predicted/fastest: profile / export", "probe")
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
        print("\n".join("| " + " | ".join(row) + " |" for row in rows))
    else:
        print(format_table(header, rows, "<<<>>>>>>>>"))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    for (size, which, prediction), group in ratios.items():
        worst = max(group, key=lambda r: abs(math.log(r)))
        print(f"{size} {which}, {prediction} prediction: {len(group)} graphs; predicted/measured from {min(group):.2f} "
              f"to {max(group):.2f}, geometric mean {math.exp(sum(map(math.log, group)) / len(group)):.2f}; "
              f"within {WITHIN}x: {sum(1 / WITHIN <= r <= WITHIN for r in group)} of {len(group)} (worst {worst:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

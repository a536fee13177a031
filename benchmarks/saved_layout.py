"""A graph onnxruntime optimizes while the session loads against the same graph saved and loaded again.

At ORT_ENABLE_ALL onnxruntime rewrites convolutions into its blocked (NCHWc) kernels when a session loads;
``optimized_model_filepath`` saves the graph it made (the transformer optimizer's ``opt_level=99`` does).  For
each export given, this times in turn, in one process, one thread, ORT_ENABLE_ALL: the original, ours (the
corpus comparison's import, optimization and export, after which the process holds what an optimization run
leaves), and each of the two saved after its session's optimization and loaded again; it prints each variant's
median over the original's saved graph, the mean of ``--rounds`` timings of ``--runs`` runs, and whether the
saved graphs have the same nodes as their sources' sessions ran.

    python benchmarks/saved_layout.py CORPUS/tiny/mobilenet-v2_dynamo18_eager_static_prefill.onnx [--runs 100]

Needs the onnx extra; run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import onnx
from onnx.external_data_helper import load_external_data_for_model

from benchmarks.corpus import corpus_feeds, make_session, ours, time_in_turn
from rlx_egraph.onnx import onnx_rules


def node_signature(path: Path) -> list[tuple[str, str, int]]:
    """(domain, op, inputs) of every node of a saved graph, in order."""
    return [(n.domain, n.op_type, len(n.input)) for n in onnx.load(str(path), load_external_data=False).graph.node]


def compare(path: Path, runs: int, rounds: int) -> dict[str, float]:
    """Each variant's median ms over the original's saved graph's, averaged over ``rounds`` timings."""
    entries = {e["file"]: e for e in json.loads((path.parent / "corpus.json").read_text())["exports"]}
    entry = entries[path.name]
    model, info = ours(path, entry, onnx_rules())
    if model is None:
        raise SystemExit(f"{path.name}: {info['error']}")
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"original": path, "ours": model.SerializeToString()}
        sessions, saved = {}, {}
        for label, source in sources.items():
            saved[label] = Path(tmp) / f"{label}.onnx"
            sessions[label] = make_session(source, "ORT_ENABLE_ALL", saved[label])
        for label in sources:
            graph = onnx.load(str(saved[label]), load_external_data=False)  # weights it left beside the original
            load_external_data_for_model(graph, str(path.parent))
            sessions[f"{label} saved"] = make_session(graph.SerializeToString(), "ORT_ENABLE_ALL")
        same = node_signature(saved["original"]) == node_signature(saved["ours"])
        inputs = corpus_feeds(entry, onnx.load(str(path), load_external_data=False), entry["shapes"][0])
        ratios: dict[str, list[float]] = {label: [] for label in sessions}
        for _ in range(rounds):
            medians, _ = time_in_turn(sessions, inputs, runs, 10)
            for label, ms in medians.items():
                ratios[label].append(ms / medians["original saved"])
    print(f"{path.name}: the sessions of the original and of ours run the same nodes: {same}")
    return {label: statistics.mean(r) for label, r in ratios.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exports", nargs="+", type=Path, help="exports listed in their folder's corpus.json")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per variant and round (default 100)")
    parser.add_argument("--rounds", type=int, default=4, help="timings averaged (default 4)")
    args = parser.parse_args(argv)
    for path in args.exports:
        ratios = compare(path, args.runs, args.rounds)
        print("  " + ", ".join(f"{label} {ratio:.3f}" for label, ratio in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.dynamic_axes CORPUS/tiny``: dynamic exports against their static twins.

For every export with dynamic axes in each folder's ``corpus.json`` (the dev half, then the held-out half) and the
static export of the same model, exporter, attention and kind (``_dynamic_`` -> ``_static_`` in the file name):

* both are imported (the dynamic one with its symbols kept), optimized with ``optimize(target="onnxruntime")``
  (the dynamic one priced at the export's hint sizes, ``dim_hints``) and exported;
* the fused ops of each export (``com.microsoft`` ops and the standard fused ones, per kind) are compared: at the
  hint shape the dynamic export should fuse what the static one does (``same``: equal counts for every kind);
* the dynamic export runs in onnxruntime at every shape the corpus lists for it (two for a prefill, three past
  lengths for a decoding step), against the original in an ORT_ENABLE_BASIC session: parity is the worst output's
  max |ours - original| / max |original| (``corpus.parity``); at most 1e-4 passes.

It prints one markdown table per half and a line of totals.  Needs onnx and onnxruntime (not torch); run from the
repository root with the project installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from benchmarks.corpus import PARITY, corpus_feeds, make_session, one_line, parity
from rlx_egraph import optimize
from rlx_egraph.frontends.onnx.compare import op_counts
from rlx_egraph.onnx import export_model, import_model


def optimized(path: Path, hints: Mapping[str, int] | None) -> onnx.ModelProto:
    """Import (symbols kept), optimize for onnxruntime at ``hints``, export."""
    return export_model(optimize(import_model(onnx.load(str(path))), target="onnxruntime", dim_hints=hints or None))


def fused(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(op_counts(model)[2].items()))


def bindings(folder: Path, entry: Mapping[str, Any]) -> list[str]:
    """Each shape of the export as the values of its model's symbolic dims (``batch 2, sequence 16``)."""
    model = onnx.load(str(folder / entry["file"]), load_external_data=False)
    out = []
    for shapes in entry["shapes"]:
        values: dict[str, int] = {}
        for info in model.graph.input:
            for d, size in zip(info.type.tensor_type.shape.dim, shapes.get(info.name, ()), strict=False):
                if re.fullmatch(r"[A-Za-z_]\w*", d.dim_param):  # a symbol (not "past_sequence + 1")
                    values.setdefault(d.dim_param, size)
        out.append(", ".join(f"{name} {size}" for name, size in values.items()))
    return out


def row(folder: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Fused counts of the static and the dynamic export, and the dynamic export's parity at each shape."""
    static_file = entry["file"].replace("_dynamic_", "_static_")
    out: dict[str, Any] = {"file": entry["file"], "arch": entry["arch"], "exporter": entry["exporter"],
                           "attn": entry["attn"], "kind": entry["kind"], "held_out": entry["held_out"],
                           "shapes": bindings(folder, entry), "parity": []}
    stage = "static"
    try:
        out["static"] = fused(optimized(folder / static_file, None))
        stage = "dynamic"
        model = optimized(folder / entry["file"], entry["hints"])
        out["dynamic"] = fused(model)
        stage = "run"
        original = onnx.load(str(folder / entry["file"]), load_external_data=False)
        names = [o.name for o in original.graph.output]
        reference = make_session(folder / entry["file"], "ORT_ENABLE_BASIC")
        ours = make_session(model.SerializeToString(), "ORT_ENABLE_BASIC")
        for shapes in entry["shapes"]:
            inputs = corpus_feeds(entry, original, shapes)
            out["parity"].append(parity(reference.run(names, inputs), ours.run(names, inputs)))
    except Exception as exc:  # a failure is a result of the run, reported on the export's row
        out["error"] = one_line(stage, exc)
    return out


def counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in counts.items()) or "none"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | exporter | attn | kind | static fused | dynamic fused (at the hint shape) | same | "
             "parity at each shape |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r and "dynamic" not in r:
            lines.append(f"| {r['arch']} | {r['exporter']} | {r['attn']} | {r['kind']} | "
                         f"{counts_text(r['static']) if 'static' in r else '-'} | - | - | {r['error']} |")
            continue
        same = "yes" if r["static"] == r["dynamic"] else "**no**"
        dynamic = "same" if r["static"] == r["dynamic"] else counts_text(diff(r["static"], r["dynamic"]))
        checks = [f"{s}: {p:.1e}{'' if p <= PARITY else ' **fail**'}"
                  for s, p in zip(r["shapes"], r["parity"], strict=False)]
        if "error" in r:
            checks.append(r["error"])
        lines.append(f"| {r['arch']} | {r['exporter']} | {r['attn']} | {r['kind']} | {counts_text(r['static'])} | "
                     f"{dynamic} | {same} | {'; '.join(checks)} |")
    return lines


def diff(static: Mapping[str, int], dynamic: Mapping[str, int]) -> dict[str, int]:
    """The dynamic export's counts of the kinds whose count differs from the static one's (0 where it has none)."""
    return {op: dynamic.get(op, 0) for op in sorted(set(static) | set(dynamic)) if static.get(op) != dynamic.get(op)}


def passed(r: Mapping[str, Any]) -> bool:
    return ("error" not in r and r["static"] == r["dynamic"] and len(r["parity"]) == len(r["shapes"])
            and all(p <= PARITY for p in r["parity"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_axes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="*", help="folders with a corpus.json")
    parser.add_argument("--only", default="", help="comma-separated substrings: only exports whose file has one")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--from-json", type=Path, help="only print the table of the rows an earlier run wrote")
    args = parser.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    rows = json.loads(args.from_json.read_text()) if args.from_json else []
    if not args.folders and not args.from_json:
        parser.error("give corpus folders, or --from-json")
    for folder in args.folders:
        manifest = folder / "corpus.json"
        if not manifest.is_file():
            parser.error(f"{folder}: no corpus.json (made by scripts/export_hf_models.py)")
        for entry in json.loads(manifest.read_text())["exports"]:
            if entry["axes"] == "dynamic" and (not only or any(s in entry["file"] for s in only)):
                rows.append(row(folder, entry))
                r = rows[-1]
                print(f"{r['file']}: {'ok' if passed(r) else 'MISS'} {r.get('error', '')}", file=sys.stderr,
                      flush=True)
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1))
    text = []
    for title, held_out in (("Development architectures", False), ("Held-out architectures", True)):
        half = [r for r in rows if r["held_out"] == held_out]
        if half:
            text += [f"### {title}", "", *table(half), "",
                     f"{sum(map(passed, half))} of {len(half)} exports: same fused counts and parity "
                     f"<= {PARITY:g} at every shape", ""]
    with contextlib.suppress(BrokenPipeError):
        print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.dynamic_axes CORPUS/tiny``: dynamic exports against their static twins.

For every export with dynamic axes in each folder's ``corpus.json`` (the dev half, then the held-out half) and the
static export of the same model, exporter, attention and kind (``_dynamic_`` -> ``_static_`` in the file name; where
the corpus has none, as for the real-size models, the dynamic export imported with its symbols bound to the hint
shape stands for it):

* both are imported (the dynamic one with its symbols kept), optimized with ``optimize(target="onnxruntime")``
  (the dynamic one priced at the export's hint sizes, ``dim_hints``) and exported;
* the fused ops of each export (``com.microsoft`` ops and the standard fused ones, per kind) are compared: at the
  hint shape the dynamic export should fuse what the static one does (``same``: equal counts for every kind);
* the dynamic export runs in onnxruntime at every shape the corpus lists for it (two for a prefill, three past
  lengths for a decoding step), against the original in an ORT_ENABLE_BASIC session: parity is the worst output's
  max |ours - original| / max |original| (``corpus.parity``); at most 1e-4 passes.

It prints one markdown table per corpus size and half and a line of totals; ``--page docs/dynamic_axes.md`` writes
them as that documentation page (with ``--from-json``, from rows earlier runs wrote: one run per folder).  Needs onnx
and onnxruntime (not torch); run from the repository root with the project installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from benchmarks.corpus import PARITY, corpus_feeds, make_session, one_line, parity
from rlx_egraph import optimize
from rlx_egraph.frontends.onnx.compare import op_counts
from rlx_egraph.onnx import export_model, import_model

PAGE_COMMAND = "python -m benchmarks.dynamic_axes CORPUS/tiny CORPUS/real --page docs/dynamic_axes.md"
SIZES = {"tiny": "Tiny models", "real": "Real-size models"}


def optimized(path: Path, hints: Mapping[str, int] | None,
              bound: Mapping[str, list[int]] | None = None) -> onnx.ModelProto:
    """Import (symbols kept; ``bound``: every input bound to those shapes), optimize for onnxruntime at ``hints``,
    export.  Imported from the path: external data is read from the model's folder."""
    return export_model(optimize(import_model(path, bound), target="onnxruntime", dim_hints=hints or None))


def fused(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(op_counts(model)[2].items()))


def symbol_values(folder: Path, entry: Mapping[str, Any]) -> list[dict[str, int]]:
    """Each shape of the export as the values of its model's symbolic dims (``{"batch": 2, "sequence": 16}``)."""
    model = onnx.load(str(folder / entry["file"]), load_external_data=False)
    out = []
    for shapes in entry["shapes"]:
        values: dict[str, int] = {}
        for info in model.graph.input:
            for d, size in zip(info.type.tensor_type.shape.dim, shapes.get(info.name, ()), strict=False):
                if re.fullmatch(r"[A-Za-z_]\w*", d.dim_param):  # a symbol (not "past_sequence + 1")
                    values.setdefault(d.dim_param, size)
        out.append(values)
    return out


def row(folder: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Fused counts of the static and the dynamic export, and the dynamic export's parity at each shape."""
    static_file = folder / entry["file"].replace("_dynamic_", "_static_")
    out: dict[str, Any] = {"file": entry["file"], "arch": entry["arch"], "exporter": entry["exporter"],
                           "attn": entry["attn"], "kind": entry["kind"], "held_out": entry["held_out"],
                           "size": entry["size"], "parity": [], "static_export": static_file.is_file()}
    values = symbol_values(folder, entry)
    out["shapes"] = [", ".join(f"{name} {size}" for name, size in v.items()) for v in values]
    stage = "static"
    try:
        if static_file.is_file():
            out["static"] = fused(optimized(static_file, None))
        else:  # the dynamic export bound to its hint shape (the first the corpus lists)
            if any(entry["hints"].get(name, size) != size for name, size in values[0].items()):
                raise ValueError(f"its first shape ({out['shapes'][0]}) is not the hint shape {entry['hints']}")
            out["static"] = fused(optimized(folder / entry["file"], None, entry["shapes"][0]))
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


def tables(rows: list[dict[str, Any]], level: str = "###") -> list[str]:
    """A table and a line of totals per corpus size (tiny first) and half (development first)."""
    text = []
    for size in sorted({r.get("size", "tiny") for r in rows}, key=lambda z: (z != "tiny", z)):
        of_size = [r for r in rows if r.get("size", "tiny") == size]
        text += [f"{level} {SIZES.get(size, size)}", ""]
        if not all(r.get("static_export", True) for r in of_size):
            text += ["The corpus has no static exports of this size: the static column is the dynamic export "
                     "imported with its symbols bound to the hint shape (the first shape listed).", ""]
        for title, held_out in (("Development architectures", False), ("Held-out architectures", True)):
            half = [r for r in of_size if r["held_out"] == held_out]
            if half:
                text += [f"{level}# {title}", "", *table(half), "",
                         f"{sum(map(passed, half))} of {len(half)} exports: same fused counts and parity "
                         f"<= {PARITY:g} at every shape", ""]
    return text


def machine() -> str:
    """The hardware class: cores and CPU model, and the onnxruntime version."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.machine()}, onnxruntime {ort.__version__}"


def page(rows: list[dict[str, Any]]) -> str:
    """The documentation page of ``rows``: what is compared, the command, the machine, the tables."""
    head = [
        "# Dynamic axes: each export against its static twin", "",
        "<!-- Written by the command below; edit benchmarks/dynamic_axes.py, not this page. -->", "",
        "Every export of the corpus ([corpus](corpus.md)) with dynamic axes is imported with its symbols kept, "
        "optimized for onnxruntime priced at the export's hint sizes, and exported with its `dim_param`s. Its fused "
        "ops are compared with those of the static export of the same model, exporter, attention and step (the "
        "`com.microsoft` ops and the standard fused ones, per kind; `same` when every count is equal), and it runs "
        "in onnxruntime at every shape the corpus lists for it (two per prefill; two or three past lengths per "
        "decoding step) against the original in an `ORT_ENABLE_BASIC` session. Parity is the worst output's "
        "max |ours - original| / max |original|; at most 1e-4 passes. The dynamic column lists only the kinds whose "
        "count differs from the static one's.", "",
        "    " + PAGE_COMMAND, "",
        "(one run per corpus folder with `--json`, then `--from-json` of each run with `--page`, writes the same "
        f"page.) Measured on {machine()}.", "",
    ]
    return "\n".join(head + tables(rows, "##")).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_axes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="*", help="folders with a corpus.json")
    parser.add_argument("--only", default="", help="comma-separated substrings: only exports whose file has one")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--from-json", type=Path, action="append", default=[],
                        help="add the rows an earlier run wrote (repeatable)")
    parser.add_argument("--page", type=Path, help="write the tables as this documentation page")
    args = parser.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    rows = [r for path in args.from_json for r in json.loads(path.read_text())]
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
    if args.page:
        args.page.write_text(page(rows))
    with contextlib.suppress(BrokenPipeError):
        print("\n".join(tables(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The corpus comparison: every export of ``scripts/export_hf_models.py`` against onnxruntime, in one run.

    python benchmarks/corpus.py CORPUS/tiny CORPUS/real --ort-python VENV/bin/python \\
        --markdown corpus.md --json corpus.json

For every file listed in each folder's ``corpus.json``:

* *launches* (nodes other than Reshape, Squeeze, Unsqueeze, Flatten, Identity, Constant) of the original, of
  onnxruntime's transformer optimizer at opt_level 0, 1 and 99 (run by ``ort_transformers_worker.py`` under
  ``--ort-python``, an environment with onnxruntime and sympy) and of ours (``import_model`` with the model's
  symbolic dims kept, ``optimize_with_report(target="onnxruntime", rules=onnx_rules(), dim_hints=...)`` at the
  export's example sizes, the export ``price_export`` prices; in a worker process, :class:`OursWorker`, so that the
  process that times onnxruntime runs nothing else);
* *nodes after ORT_ENABLE_ALL*: the node count of the graph an ORT_ENABLE_ALL session makes of each;
* *latency*: one onnxruntime CPU thread, ORT_ENABLE_ALL sessions, the median of ``--runs`` runs (``--real-runs``
  for real-size models) by the thread's CPU time after warm-up runs, the variants run in turn so that a change of
  load hits all alike.
  The reference is the faster of the original (what a default session makes of it) and the transformer
  optimizer's fastest level; the ratio is ours / reference (below 1: ours is faster).  Ours is also exported
  with ``ort_optimized=True`` (onnxruntime's offline optimization saved, as the transformer optimizer's
  opt_level 99 writes it) and timed beside (*ours saved*); where the reference is that level's output, the
  ratio is ours saved / reference: both sides then run a graph onnxruntime optimized and saved;
* *parity*: per output, the largest |ours - original| over the original's largest magnitude (the original in
  an ORT_ENABLE_BASIC session), the worst output; at every shape of the export (two for dynamic exports,
  three past lengths for dynamic decoding steps);
* *prediction*: the predicted latency of our export at the hint sizes (``price_export``: the optimized graph's IO
  profile with the export's run-time shape nodes added and the nodes it does not write taken off) over the
  fastest of ours' timed runs (the calibration keeps each sample's fastest pass too; on a shared machine
  the median of a sub-millisecond model moves with the other jobs' load).

Targets, per export: parity within 1e-4; fewer launches than the transformer optimizer's level with the fewest;
ours / reference <= 1.02; predicted / measured within 1.5x either way.  Per group: geometric mean of ours /
reference <= 0.85 at tiny size and in decoding, <= 1.0 at real size.  The held-out architectures are a
separate table.  Needs onnx and onnxruntime in this environment (not torch); run from the repository root
with the project installed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import hashlib
import json
import math
import multiprocessing
import os
import platform
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from rlx_egraph import optimize_with_report
from rlx_egraph.cost import calibration as cal
from rlx_egraph.frontends.onnx.calibrate import run_times
from rlx_egraph.frontends.onnx.compare import feeds, op_counts
from rlx_egraph.frontends.onnx.latency import BLOCK
from rlx_egraph.onnx import import_model, onnx_rules, price_export, save_ort_optimized

LEVELS = ("0", "1", "99")
PARITY = 1e-4
SAVED = "ours saved"  # ours exported with ort_optimized=True: onnxruntime's offline optimization of ours
SLOWER = 1.02  # ours may be at most 2% slower than the reference on any export
GEOMEAN = {"tiny": 0.85, "decode": 0.85, "real": 1.0}
PREDICTION = 1.5
WARMUP = {"tiny": 10, "real": 2}
TF_TIMEOUT = {"tiny": 300.0, "real": 1800.0}  # seconds for the transformer optimizer's three levels


# --- onnxruntime -------------------------------------------------------------------------------------------------

def make_session(model: Path | bytes, level: str, save: Path | None = None,
                 external: bool = False) -> ort.InferenceSession:
    """A one-thread CPU session at ``level``; ``save``: where to write the graph it makes (``external``: its
    weights beside it)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.log_severity_level = 4
    if save is not None:
        opts.optimized_model_filepath = str(save)
    if save is not None and external:
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{save.name}.data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    data = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def saved_nodes(save: Path) -> int:
    """Nodes of a graph a session saved; the files are removed."""
    count = len(onnx.load(str(save), load_external_data=False).graph.node)
    for path in (save, save.with_name(f"{save.name}.data")):
        path.unlink(missing_ok=True)
    return count


def time_in_turn(sessions: Mapping[str, ort.InferenceSession], inputs: Mapping[str, np.ndarray], runs: int,
                 warmup: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median and fastest ms of one run of each session, over ``runs`` timed runs each, timed as
    :func:`~rlx_egraph.frontends.onnx.calibrate.run_times` times runs in turn: blocks of :data:`BLOCK` runs in a
    row, the first of each not timed (it pays for the caches the other sessions' runs filled, up to 1.5x a
    sub-millisecond model's run, which a model run repeatedly by itself, as an application runs it, does not),
    each round starting one session later, by the calling thread's CPU time (a one-thread session runs on it:
    the time other processes of a shared machine hold the core is left out, as in the calibration)."""
    feeds = dict(inputs)
    labels = list(sessions)
    times = run_times([lambda s=sessions[label]: s.run(None, feeds) for label in labels], 0.0, runs, 1,
                      max_runs=runs, warmup=warmup, block=BLOCK)
    return ({label: 1e-6 * statistics.median(t) for label, t in zip(labels, times, strict=True)},
            {label: 1e-6 * min(t) for label, t in zip(labels, times, strict=True)})


def parity(want: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Worst over outputs of max |got - want| / max |want|; inf when a shape differs."""
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        if w.shape != g.shape:
            return math.inf
        if w.size:
            diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max() / max(float(np.abs(w).max()), 1e-30)))
    return worst


def corpus_feeds(entry: Mapping[str, Any], model: onnx.ModelProto, shapes: Mapping[str, list[int]]
                 ) -> dict[str, np.ndarray]:
    """Seeded inputs (``compare.feeds``: ids below the vocabulary, a padding mask on every batch row but the
    first); a decoding step's mask pads the first key (left padding) instead of the last."""
    inputs = feeds(model, {k: tuple(v) for k, v in shapes.items()}, max(int(entry["vocab"]), 1))
    mask = inputs.get("attention_mask")
    if entry["kind"] == "decode" and mask is not None:
        mask[...] = 1
        mask[1:, 0] = 0
    return inputs


# --- the transformer optimizer -----------------------------------------------------------------------------------

class TransformerOptimizer:
    """``ort_transformers_worker.py`` under ``python``: one long-lived process, started again after a job that
    overran its time."""

    def __init__(self, python: str, log: Path) -> None:
        self.python, self.log = python, log.open("w")
        self.proc: subprocess.Popen[str] | None = None
        self.error = ""
        self.start()

    def start(self) -> None:
        worker = Path(__file__).with_name("ort_transformers_worker.py")
        try:
            self.proc = subprocess.Popen([self.python, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.log, text=True)
        except OSError as exc:
            self.proc, self.error = None, f"cannot run {self.python}: {exc.strerror}"

    def run(self, entry: Mapping[str, Any], path: Path, work: Path, timeout: float) -> dict[str, Path | str]:
        """Level -> output path, or why there is none."""
        outs = {level: work / f"{path.stem}.tf{level}.onnx" for level in LEVELS}
        if self.proc is not None and self.proc.poll() is not None:  # a job before this one stopped it
            self.start()
        if self.proc is None:
            return dict.fromkeys(LEVELS, self.error)
        job = {"input": str(path), "model_type": entry["ort_model_type"], "num_heads": entry["num_heads"],
               "hidden_size": entry["hidden_size"], "external": entry["size"] == "real",
               "outputs": {level: str(out) for level, out in outs.items()}}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.proc.kill()
            self.proc.wait()
            self.start()
            return dict.fromkeys(LEVELS, f"the transformer optimizer took over {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            status = self.proc.wait()
            why = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
            return dict.fromkeys(LEVELS, f"the transformer optimizer stopped ({why})")
        errors = json.loads(line)
        return {level: outs[level] if errors[level] is None else errors[level] for level in LEVELS}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
        self.log.close()


# --- one export --------------------------------------------------------------------------------------------------

def counts(model: onnx.ModelProto) -> dict[str, Any]:
    nodes, launches, fused = op_counts(model)
    return {"nodes": nodes, "launches": launches, "fused": dict(sorted(fused.items()))}


def one_line(stage: str, exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{stage}: {type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def ours(path: Path, entry: Mapping[str, Any], rules: Any,
         bound: bool = False) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """Import (symbolic dims kept; ``bound``: every input bound at the export's first shape), optimize for
    onnxruntime at the hint sizes, export."""
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    stage = "load"
    try:
        proto = onnx.load(str(path))
        stage = "import"
        graph = import_model(proto, entry["shapes"][0] if bound else None)
        stage = "optimize"
        optimized, report = optimize_with_report(graph, target="onnxruntime", rules=rules,
                                                 dim_hints=None if bound else entry["hints"] or None)
        stage = "export"
        priced = price_export(optimized, report.profile_after.target)  # the export, priced node by node
        model = priced.model
    except Exception as exc:  # a failure of ours is a result of the run, reported per export
        info["error"] = one_line(stage, exc)
        return None, info
    info["seconds"] = round(time.perf_counter() - t0, 3)
    info["predicted_ms"] = priced.ns / 1e6
    info |= counts(model)
    return model, info


Ours = Callable[[Path, Mapping[str, Any], bool], tuple[onnx.ModelProto | None, dict[str, Any]]]


def ours_here(path: Path, entry: Mapping[str, Any], bound: bool = False
                     ) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """:func:`ours` with :func:`~rlx_egraph.onnx.onnx_rules` (loaded once per process), in this process."""
    return ours(path, entry, _rules(), bound)


@functools.cache
def _rules() -> Any:
    return onnx_rules()


class OursWorker:
    """:func:`ours` in a process of its own (spawned: a fresh interpreter), so that the process that times
    onnxruntime runs nothing else: after our optimizer had run in it, onnxruntime's runs there measured slower
    (not so after onnxruntime sessions alone), so that the later an export came in a run, the slower it measured.
    A worker that stopped is started again for the next export."""

    def __init__(self) -> None:
        self.pool = self._start()

    @staticmethod
    def _start() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def __call__(self, path: Path, entry: Mapping[str, Any], bound: bool = False
                 ) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
        try:
            return self.pool.submit(ours_here, path, dict(entry), bound).result()
        except BrokenProcessPool as exc:
            self.pool = self._start()
            return None, {"error": one_line("optimize worker", exc)}

    def close(self) -> None:
        self.pool.shutdown()


def measure(entry: Mapping[str, Any], folder: Path, work: Path, optimizer: TransformerOptimizer, optimize: Ours,
            runs: int, bind: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The row of one export, ours made by ``optimize`` (:func:`ours` with the rules: :class:`OursWorker` in a
    run).  A dynamic export of a size in ``bind`` that ours cannot import with its symbols is measured bound at its
    first shape (``row["bound"]``, ``row["ours"]`` keeps the failure)."""
    path = folder / entry["file"]
    row: dict[str, Any] = {k: entry[k] for k in ("file", "arch", "family", "held_out", "size", "exporter", "attn",
                                                  "axes", "kind")}
    meta = onnx.load(str(path), load_external_data=False)
    row["original"] = counts(meta)
    model, row["ours"] = optimize(path, entry, False)
    sizes = entry["shapes"]
    if model is None and entry["axes"] == "dynamic" and entry["size"] in bind:
        model, row["bound"] = optimize(path, entry, True)
        sizes = sizes[:1]  # a bound import runs at that shape only
    if model is None:  # nothing to compare: the row is the failure (no reference is measured)
        row |= {"transformers": {}, "after_ort_all": {}, "runs": [{"shapes": s} for s in entry["shapes"]]}
        return judge(row)
    mine = "bound" if "bound" in row else "ours"
    tf_out = optimizer.run(entry, path, work, TF_TIMEOUT[entry["size"]])
    row["transformers"] = {}
    candidates: dict[str, Path | bytes] = {"original": path}
    seen: dict[str, str] = {}
    for level, out in tf_out.items():
        if isinstance(out, str):
            row["transformers"][level] = {"error": out}
            continue
        tf_meta = onnx.load(str(out), load_external_data=False)
        key = hashlib.sha256(b"".join(n.SerializeToString() for n in tf_meta.graph.node)).hexdigest()
        row["transformers"][level] = counts(tf_meta) | ({"same_as": seen[key]} if key in seen else {})
        if key not in seen:
            seen[key] = f"tf{level}"
            candidates[f"tf{level}"] = out
    candidates["ours"] = model.SerializeToString()
    saved = work / f"{path.stem}.ours-saved.onnx"
    try:  # the export option that writes onnxruntime's offline optimization of ours (what tf99 is of the original)
        save_ort_optimized(model, saved, external_data=entry["size"] == "real")
        candidates[SAVED] = saved
    except Exception as exc:
        row[mine]["saved_error"] = one_line("ort_optimized export", exc)
    del model
    sessions: dict[str, ort.InferenceSession] = {}
    row["after_ort_all"] = {}
    for label, source in candidates.items():
        save = work / f"{path.stem}.{label}.all.onnx"
        try:
            try:
                sessions[label] = make_session(source, "ORT_ENABLE_ALL", save, external=entry["size"] == "real")
                row["after_ort_all"][label] = saved_nodes(save)
            except Exception:  # onnxruntime could not save the graph it made: time it all the same
                sessions[label] = make_session(source, "ORT_ENABLE_ALL")
                row["after_ort_all"][label] = None
        except Exception as exc:  # an output onnxruntime cannot load is a result too
            error = one_line("onnxruntime session", exc)
            if label == "ours":
                row[mine]["error"] = error
            elif label == SAVED:
                row[mine]["saved_error"] = error
            else:
                row["transformers"][label.removeprefix("tf")]["error"] = error
    del candidates
    reference = make_session(path, "ORT_ENABLE_BASIC")
    names = [o.name for o in meta.graph.output]
    row["runs"] = []
    warmup = WARMUP[entry["size"]]
    for i, shapes in enumerate(sizes):
        run: dict[str, Any] = {"shapes": shapes}
        inputs = corpus_feeds(entry, meta, shapes)
        want = reference.run(names, inputs)
        if "ours" in sessions:
            try:
                run["parity"] = parity(want, sessions["ours"].run(names, inputs))
            except Exception as exc:  # ours does not run at this shape
                run["parity"] = None
                run["error"] = one_line("run", exc)
        if i == 0 or entry["size"] == "tiny":
            timed = {k: s for k, s in sessions.items() if not k.startswith("ours") or "error" not in run}
            run["ms"], run["fastest_ms"] = time_in_turn(timed, inputs, runs, warmup)
        row["runs"].append(run)
    del sessions, reference
    gc.collect()
    for out in [*tf_out.values(), saved]:
        if isinstance(out, Path):
            out.unlink(missing_ok=True)
            out.with_name(f"{out.name}.data").unlink(missing_ok=True)
    return judge(row)


def failed_row(entry: Mapping[str, Any], error: str) -> dict[str, Any]:
    """The row of an export that could not be measured at all."""
    row = {k: entry[k] for k in ("file", "arch", "family", "held_out", "size", "exporter", "attn", "axes", "kind")}
    row |= {"original": {"launches": "-"}, "transformers": {}, "ours": {"error": error}, "after_ort_all": {},
            "runs": [{"shapes": entry["shapes"][0]}]}
    return judge(row)


def _reference(ms: Mapping[str, float]) -> tuple[str, float]:
    options = {k: v for k, v in ms.items() if not k.startswith("ours")}
    label = min(options, key=options.__getitem__)
    return label, options[label]


def _timed_ours(ms: Mapping[str, float], reference: str) -> str:
    """Which of ours is judged against ``reference``: where it is the transformer optimizer's opt_level 99 output
    (a graph onnxruntime's session optimized and saved), ours exported the same way (``ort_optimized=True``),
    else ours as exported."""
    return SAVED if reference == "tf99" and SAVED in ms else "ours"


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """The row's ratios and its targets (True met, False missed, None not measurable).  A bound measurement
    (``row["bound"]``) gets its ratio, parity and prediction there; the row itself, whose symbolic import
    failed, meets no target."""
    ms = row["runs"][0].get("ms", {})
    row["reference"], row["reference_ms"] = _reference(ms) if ms else (None, None)
    mine = row.get("bound", row["ours"])
    row["timed"] = _timed_ours(ms, row["reference"]) if ms else "ours"
    measured = ms.get(row["timed"])
    ratio = measured / row["reference_ms"] if measured else None
    others = [r["ms"][_timed_ours(r["ms"], ref)] / ref_ms for r in row["runs"][1:] if "ours" in r.get("ms", {})
              for ref, ref_ms in [_reference(r["ms"])]]
    ok = "error" not in mine and all(r.get("parity") is not None for r in row["runs"])
    worst = max((r["parity"] for r in row["runs"] if r.get("parity") is not None), default=None) if ok else None
    # against ours' fastest run: the calibration keeps each sample's fastest pass, and on a machine shared with
    # other jobs the median of a sub-millisecond model moves with their load (rows of older runs: the median)
    fastest = row["runs"][0].get("fastest_ms", ms).get("ours")
    prediction = mine["predicted_ms"] / fastest if ok and fastest else None
    levels = [v["launches"] for v in row["transformers"].values() if "launches" in v]
    targets = {
        "parity": ok and worst <= PARITY,
        "launches": (mine["launches"] < min(levels)) if ok and levels else (None if ok else False),
        "latency": ratio is not None and max([ratio, *others]) <= SLOWER,
        "prediction": prediction is not None and 1 / PREDICTION <= prediction <= PREDICTION,
    }
    if "bound" in row:
        row["bound"] |= {"ratio": ratio, "parity": worst, "prediction": prediction, "targets": targets}
        ratio, others, worst, prediction, targets = None, [], None, None, dict.fromkeys(targets, False)
    saved = ms.get(SAVED)
    row |= {"ratio": ratio, "other_ratios": others, "parity": worst, "prediction": prediction, "targets": targets,
            "saved_ratio": saved / row["reference_ms"] if saved and "bound" not in row else None}
    return row


# --- the report --------------------------------------------------------------------------------------------------

def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def groups(rows: list[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]], float | None]]:
    """(class, rows, geometric-mean target) of one half."""
    for size in ("tiny", "real"):
        for kind in ("prefill", "decode"):
            members = [r for r in rows if r["size"] == size and r["kind"] == kind]
            if members:
                target = GEOMEAN["real"] if size == "real" else GEOMEAN["tiny"]
                yield f"{size} {kind}", members, target
        members = [r for r in rows if r["size"] == size]
        if members:
            yield f"{size} (all)", members, GEOMEAN[size]
    members = [r for r in rows if r["kind"] == "decode"]
    if members:
        yield "decoding (all sizes)", members, GEOMEAN["decode"]


def summary(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| class | exports | ours ran | parity <= 1e-4 | fewer launches | <= 1.02x reference | "
           "prediction within 1.5x | geomean ours / reference (exports) | geomean target | "
           "bound at the first shape: geomean (exports) |", "|---" * 10 + "|"]
    for name, members, target in groups(rows):
        ran = [r for r in members if r["ratio"] is not None]
        mean = geomean([r["ratio"] for r in ran])
        met = "-" if mean is None else ("met" if mean <= target else "missed")
        counts_ = [sum(r["targets"][t] is True for r in members) for t in ("parity", "launches", "latency",
                                                                             "prediction")]
        bound = [r["bound"]["ratio"] for r in members if r.get("bound", {}).get("ratio") is not None]
        out.append(f"| {name} | {len(members)} | {len(ran)} | " + " | ".join(map(str, counts_))
                   + f" | {_f(mean, '.3f')} ({len(ran)}) | <= {target} {met} | "
                   + (f"{_f(geomean(bound), '.3f')} ({len(bound)}) |" if bound else "- |"))
    return out


def _misses(row: dict[str, Any]) -> str:
    """The targets the row misses, or the failure of ours that stopped its measurement."""
    bound = row.get("bound")
    if bound is not None and "error" not in bound:
        missed = [t for t, ok in bound["targets"].items() if ok is False]
        text = f"symbolic: {row['ours']['error']}; bound at the first shape misses: {', '.join(missed) or 'none'}"
        return text.replace("|", "\\|")[:300]
    if "error" in row["ours"]:
        return f"ours failed: {row['ours']['error']}".replace("|", "\\|")[:220]
    missed = [t for t, ok in row["targets"].items() if ok is False]
    errors = [r["error"] for r in row["runs"] if r.get("error")]
    return (", ".join(missed) + "".join(f"; {e}" for e in errors)).replace("|", "\\|")[:220]


def failure_kind(error: str) -> str:
    """An error with its names and numbers left out, so that one cause on many exports is one line."""
    text = re.sub(r"'[^']*'", "'…'", error)
    return re.sub(r"\b\d+\b", "N", text)[:160]


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """Why ours failed, grouped by cause: exports, architectures, one example."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        error = r["ours"].get("error") or next((x["error"] for x in r["runs"] if x.get("error")), None)
        if error:
            kinds.setdefault(failure_kind(error), []).append(r)
    if not kinds:
        return ["none"]
    out = ["| cause | exports | architectures | e.g. |", "|---|---|---|---|"]
    for kind, members in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        archs = ", ".join(sorted({r["arch"] for r in members}))
        out.append(f"| {kind.replace('|', '\\|')} | {len(members)} | {archs} | "
                   f"{members[0]['file'].removesuffix('.onnx')} |")
    return out


def _tf_launches(row: dict[str, Any]) -> str:
    levels = {k: v["launches"] for k, v in row["transformers"].items() if "launches" in v}
    if not levels:
        return "-"
    best = min(levels, key=levels.__getitem__)
    return f"{levels[best]} ({best})"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| export | launches: original / transformers (level) / ours | nodes after ORT_ENABLE_ALL: original / "
           "transformers / ours | reference ms | ours ms | ours / reference | other shapes | ours saved / reference | "
           "parity | predicted / measured | misses |", "|---" * 11 + "|"]
    for r in rows:
        after = r["after_ort_all"]
        tf_after = [after[k] for k in after if k.startswith("tf") and after[k] is not None]
        mine = r.get("bound", r["ours"])
        ours_l = mine.get("launches")
        ratio, parity_, prediction = (mine.get("ratio"), mine.get("parity"), mine.get("prediction")) if "bound" in r \
            else (r["ratio"], r["parity"], r["prediction"])
        mark = " (bound)" if "bound" in r and ratio is not None else ""
        ref = f"{r['reference_ms']:.3f} ({r['reference']})" if r["reference_ms"] else "-"
        ours_ms = r["runs"][0].get("ms", {}).get(r.get("timed", "ours"))
        mark += " (saved)" if r.get("timed") == SAVED else ""
        others = ", ".join(f"{x:.2f}" for x in r["other_ratios"]) or "-"
        out.append(f"| {r['file'].removesuffix('.onnx')} | {r['original']['launches']} / {_tf_launches(r)} / "
                   f"{ours_l if ours_l is not None else '-'} | {after.get('original') or '-'} / "
                   f"{min(tf_after) if tf_after else '-'} / {after.get('ours') or '-'} | {ref} | "
                   f"{_f(ours_ms, '.3f')} | "
                   f"{_f(ratio, '.3f')}{mark} | {others} | {_f(r.get('saved_ratio'), '.3f')} | {_f(parity_, '.1e')} | "
                   f"{_f(prediction, '.2f')} | "
                   f"{_misses(r)} |")
    return out


def export_failures(meta: list[dict[str, Any]]) -> list[str]:
    out = ["| size | export | torch's innermost exception |", "|---|---|---|"]
    for corpus in meta:
        out += [f"| {corpus['size']} | {f['file'].removesuffix('.onnx')} | {f['error'].replace('|', '\\|')} |"
                for f in corpus["failures"]]
    return out if len(out) > 2 else ["none"]


def architectures(meta: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[str]:
    """Per architecture: family, held out or not, exports made and failed per size, and how many ours ran."""
    archs: dict[str, dict[str, Any]] = {}
    for corpus in meta:
        for e in corpus["exports"]:
            a = archs.setdefault(e["arch"], {"family": e["family"], "held_out": e["held_out"], "made": {},
                                             "failed": {}})
            a["made"][corpus["size"]] = a["made"].get(corpus["size"], 0) + 1
        for f in corpus["failures"]:
            a = archs.setdefault(f["arch"], {"family": f.get("family", "?"), "held_out": f.get("held_out"),
                                             "made": {}, "failed": {}})
            a["failed"][corpus["size"]] = a["failed"].get(corpus["size"], 0) + 1
    ran: dict[str, int] = {}
    for r in rows:
        ran[r["arch"]] = ran.get(r["arch"], 0) + (r["ratio"] is not None)
    out = ["| architecture | family | held out | exports (tiny / real) | failed exports (tiny / real) | ours ran |",
           "|---|---|---|---|---|---|"]
    for name, a in sorted(archs.items(), key=lambda kv: (kv[1]["family"], kv[0])):
        made = " / ".join(str(a["made"].get(s, 0)) for s in ("tiny", "real"))
        failed = " / ".join(str(a["failed"].get(s, 0)) for s in ("tiny", "real"))
        held = {True: "yes", False: "", None: "?"}[a["held_out"]]
        out.append(f"| {name} | {a['family']} | {held} | {made} | {failed} | {ran.get(name, 0)} |")
    return out


def report(rows: list[dict[str, Any]], meta: list[dict[str, Any]], run: Mapping[str, Any]) -> str:
    """The markdown report (generated tables)."""
    halves = (("Development half", [r for r in rows if not r["held_out"]]),
              ("Held-out third", [r for r in rows if r["held_out"]]))
    archs = sorted({(r["arch"], r["family"], r["held_out"]) for r in rows}, key=lambda a: (a[2], a[0]))
    loads = run["loads"]
    total = sum(len(c["exports"]) for c in meta)
    out = [f"Measured: {len(rows)} of the corpus's {total} exports "
           f"({', '.join(f'{c['size']} {len(c['exports'])}' for c in meta)}); "
           f"latency: median of {run['runs']} runs ({run['real_runs']} at real size), one thread (its CPU time), "
           "ORT_ENABLE_ALL; "
           f"onnxruntime {ort.__version__}, onnx {onnx.__version__}; exports by torch {meta[0]['torch']}, "
           f"transformers {meta[0]['transformers']}; the machine's 1-minute load average during the run: "
           f"{min(loads):.1f} to {max(loads):.1f} (median {statistics.median(loads):.1f}) on {run['machine']}; "
           f"predictions priced by {run.get('priced_by', 'the shipped calibration')}; "
           f"{' + '.join(f'{m:.0f}' for m in run['minutes'])} minutes.", "",
           "Architectures (held out: " + ", ".join(a for a, _, h in archs if h) + "; development: "
           + ", ".join(a for a, _, h in archs if not h) + ").", ""]
    out += ["## Corpus", "", *architectures(meta, rows), ""]
    for title, members in halves:
        if not members:
            continue
        out += [f"## {title}: summary", "", *summary(members), ""]
    for title, members in halves:
        if not members:
            continue
        out += [f"## {title}: every export", "", *table(members), ""]
    measured = {(r["size"], r["file"]) for r in rows}
    missing = [f"{c['size']}/{e['file'].removesuffix('.onnx')}" for c in meta for e in c["exports"]
               if (c["size"], e["file"]) not in measured]
    if missing:
        out += ["## Not measured", "", f"Exports of the corpus not in this run ({len(missing)}): "
                + ", ".join(missing) + ".", ""]
    out += ["## Where ours fails", "", "Grouped by cause (names in quotes and numbers left out).", "",
            *failures(rows), ""]
    out += ["## Failed exports", "", *export_failures(meta), ""]
    return "\n".join(out)


def load_rows(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The rows of earlier runs, merged: each export once (the last run's), the corpora by size, the runs'
    loads and minutes together."""
    rows: dict[str, dict[str, Any]] = {}
    corpora: dict[str, dict[str, Any]] = {}
    runs = []
    timed: dict[str, set[int]] = {"runs": set(), "real_runs": set()}  # the setting of the runs that used it
    for path in paths:
        data = json.loads(path.read_text())
        rows |= {f"{r['size']}/{r['file']}": r for r in data["rows"]}
        corpora |= {c["size"]: c for c in data["corpora"]}
        runs.append(data["run"])
        sizes = {r["size"] for r in data["rows"]}
        timed["runs"] |= {data["run"]["runs"]} if sizes - {"real"} else set()
        timed["real_runs"] |= {data["run"]["real_runs"]} if "real" in sizes else set()
    run = runs[0] | {"loads": [x for r in runs for x in r["loads"]], "minutes": [x for r in runs for x in r["minutes"]]}
    run |= {k: " or ".join(map(str, sorted(v))) for k, v in timed.items() if v}
    order = {"tiny": 0, "real": 1}
    return list(rows.values()), sorted(corpora.values(), key=lambda c: order.get(c["size"], 2)), run


def run_info(args: argparse.Namespace, loads: list[float], started: float) -> dict[str, Any]:
    priced = cal.load("onnxruntime")
    whose = "the shipped" if priced.source == cal.shipped("onnxruntime").source else "this machine's"
    return {"runs": args.runs, "real_runs": args.real_runs, "loads": loads,
            "minutes": [round((time.perf_counter() - started) / 60, 1)],
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "priced_by": f"{whose} calibration ({priced.machine.get('cpu', '?')}; made by: {priced.command})"}


def save(path: Path, rows: list[dict[str, Any]], meta: list[dict[str, Any]], run: Mapping[str, Any]) -> None:
    corpora = [c | {"folder": Path(c["folder"]).name} for c in meta]
    path.write_text(json.dumps({"run": run, "corpora": corpora, "rows": rows}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/corpus.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="*", help="folders with a corpus.json (tiny, real)")
    parser.add_argument("--ort-python", default=sys.executable,
                        help="a Python with onnxruntime and sympy, for the transformer optimizer")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per variant and shape (default 100)")
    parser.add_argument("--real-runs", type=int, default=20, help="timed runs at real size (default 20)")
    parser.add_argument("--only", default="", help="comma-separated substrings: only exports whose file has one")
    parser.add_argument("--archs", default="", help="comma-separated architectures: only their exports")
    parser.add_argument("--bind-on-failure", default="real",
                        help="sizes (comma-separated, or 'none') whose dynamic exports, where ours cannot import "
                             "them with their symbols, are also measured bound at their first shape (default real)")
    parser.add_argument("--markdown", type=Path, help="write the report here (default: stdout)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--from-json", type=Path, action="append",
                        help="only write the report of the rows earlier runs wrote (repeat to merge runs)")
    args = parser.parse_args(argv)
    if args.from_json:
        rows, meta, run = load_rows(args.from_json)
    else:
        if not args.folders:
            parser.error("give corpus folders, or --from-json")
        meta = []
        for folder in args.folders:
            manifest = folder / "corpus.json"
            if not manifest.is_file():
                parser.error(f"{folder}: no corpus.json (made by scripts/export_hf_models.py)")
            meta.append(json.loads(manifest.read_text()) | {"folder": folder})
        only = [s for s in args.only.split(",") if s]
        archs = {s for s in args.archs.split(",") if s}
        bind = frozenset(args.bind_on_failure.split(",")) - {"none", ""}
        rows = []
        started, loads = time.perf_counter(), [os.getloadavg()[0]]
        with tempfile.TemporaryDirectory() as tmp:
            optimizer = TransformerOptimizer(args.ort_python, Path(tmp) / "transformers.log")
            worker = OursWorker()
            try:
                for corpus in meta:
                    runs = args.runs if corpus["size"] == "tiny" else args.real_runs
                    for entry in corpus["exports"]:
                        picked = (not only or any(s in entry["file"] for s in only)) and (
                            not archs or entry["arch"] in archs)
                        if not picked:
                            continue
                        try:
                            rows.append(measure(entry, corpus["folder"], Path(tmp), optimizer, worker, runs, bind))
                        except Exception as exc:  # the measurement itself failed: a row that says so
                            rows.append(failed_row(entry, one_line("measure", exc)))
                        r = rows[-1]
                        loads.append(os.getloadavg()[0])
                        if args.json:  # after every export, so that a stopped run keeps what it measured
                            save(args.json, rows, meta, run_info(args, loads, started))
                        print(f"{r['file']}: ratio {_f(r['ratio'], '.3f')} saved {_f(r.get('saved_ratio'), '.3f')} "
                              f"parity {_f(r['parity'], '.1e')} "
                              f"{_misses(r)}", file=sys.stderr, flush=True)
            finally:
                optimizer.close()
                worker.close()
        run = run_info(args, loads, started)
        for corpus in meta:
            corpus["folder"] = corpus["folder"].name
    if args.json and not args.from_json:
        save(args.json, rows, meta, run)
    text = report(rows, meta, run)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    else:
        with contextlib.suppress(BrokenPipeError):
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

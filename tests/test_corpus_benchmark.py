"""The corpus comparison (benchmarks/corpus.py) on a two-model corpus built with onnx.helper."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import onnx
import pytest

from onnx_models import MODELS
from rlx_egraph.cost import calibration as cal
from rlx_egraph.frontends.onnx.compare import op_counts
from rlx_egraph.onnx import OnnxImportError

ROOT = Path(__file__).resolve().parents[1]


def _corpus_module():
    """benchmarks/corpus.py, imported by its name from the benchmarks folder, so that the process its run spawns to
    optimize in (``OursWorker``) imports it too."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("corpus")


corpus = _corpus_module()


def _entry(file: str, arch: str, held_out: bool, shapes: list[dict[str, list[int]]], hints: dict[str, int],
           kind: str = "prefill") -> dict:
    return {"file": file, "arch": arch, "family": "encoder", "held_out": held_out, "size": "tiny",
            "exporter": "torchscript", "opset": 14, "attn": "eager", "axes": "dynamic" if hints else "static",
            "kind": kind, "shapes": shapes, "hints": hints, "vocab": 0, "ort_model_type": "bert", "num_heads": 2,
            "hidden_size": 16}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    onnx.save(MODELS["bert"](), folder / "bert.onnx")
    onnx.save(MODELS["gpt2"](), folder / "gpt2.onnx")
    shapes = [{"hidden_states": [2, 5, 16], "attention_mask": [2, 5]},
              {"hidden_states": [3, 9, 16], "attention_mask": [3, 9]}]
    exports = [_entry("bert.onnx", "bert", False, shapes, {"batch": 2, "sequence": 5}),
               _entry("gpt2.onnx", "gpt2", True, [{"hidden_states": [2, 5, 16]}], {"batch": 2, "sequence": 5},
                      kind="decode")]
    failed = [{"file": "opt_dynamo18_sdpa_dynamic_decode.onnx", "arch": "opt", "family": "decoder", "held_out": True,
               "error": "<class 'X'>: no | way"}]
    (folder / "corpus.json").write_text(json.dumps({"size": "tiny", "torch": "2.13.0", "transformers": "5.25.0",
                                                    "exports": exports, "failures": failed}))
    out = tmp_path_factory.mktemp("out")
    status = corpus.main([str(folder), "--runs", "3", "--ort-python", sys.executable, "--json",
                          str(out / "rows.json"), "--markdown", str(out / "corpus.md")])
    assert status == 0
    return json.loads((out / "rows.json").read_text()), (out / "corpus.md").read_text(), out


def test_every_export_is_a_row_with_counts_parity_at_each_shape_and_latency(result: tuple[dict, str, Path]) -> None:
    data, _, _ = result
    rows = {r["file"]: r for r in data["rows"]}
    assert list(rows) == ["bert.onnx", "gpt2.onnx"]
    bert = rows["bert.onnx"]
    nodes, launches, _ = op_counts(MODELS["bert"]())
    assert (bert["original"]["nodes"], bert["original"]["launches"]) == (nodes, launches)
    assert "error" not in bert["ours"] and bert["ours"]["launches"] < launches
    assert [r["shapes"]["attention_mask"] for r in bert["runs"]] == [[2, 5], [3, 9]]  # a dynamic export: 2 shapes
    assert all(r["parity"] <= 1e-4 for r in bert["runs"]) and bert["parity"] <= 1e-4
    assert set(bert["runs"][0]["ms"]) >= {"original", "ours"} and len(bert["other_ratios"]) == 1
    assert bert["reference"] in bert["runs"][0]["ms"] and bert["reference"] != "ours"
    assert bert["ratio"] == pytest.approx(bert["runs"][0]["ms"]["ours"] / bert["reference_ms"])
    fastest = bert["runs"][0]["fastest_ms"]
    assert set(fastest) == set(bert["runs"][0]["ms"]) and all(fastest[k] <= bert["runs"][0]["ms"][k] for k in fastest)
    assert bert["prediction"] == pytest.approx(bert["ours"]["predicted_ms"] / fastest["ours"])
    assert bert["targets"]["parity"] is True
    for level, tf in bert["transformers"].items():  # each level is an output or a one-line reason
        assert level in ("0", "1", "99") and (("launches" in tf) or ("\n" not in tf["error"]))


def test_targets_are_judged_per_row() -> None:
    row = {"ours": {"launches": 5, "predicted_ms": 3.0}, "transformers": {"0": {"launches": 6}, "1": {"error": "x"}},
           "runs": [{"parity": 2e-5, "ms": {"original": 1.0, "tf0": 0.8, "ours": 0.81}},
                    {"parity": 2e-4, "ms": {"original": 2.0, "tf0": 2.0, "ours": 1.0}}]}
    judged = corpus.judge(row)
    assert (judged["reference"], judged["reference_ms"]) == ("tf0", 0.8)
    assert judged["ratio"] == pytest.approx(0.81 / 0.8) and judged["other_ratios"] == [0.5]
    assert judged["parity"] == 2e-4 and judged["prediction"] == pytest.approx(3.0 / 0.81)
    assert judged["targets"] == {"parity": False, "launches": True, "latency": True, "prediction": False}
    failed = corpus.judge({"ours": {"error": "import: OnnxImportError: x"}, "transformers": {},
                           "runs": [{"ms": {"original": 1.0}}]})
    assert failed["ratio"] is None and set(failed["targets"].values()) == {False}


def test_report_has_both_halves_their_geometric_means_and_the_failed_exports(result: tuple[dict, str, Path]) -> None:
    data, text, _ = result
    lines = text.splitlines()
    assert lines.index("## Development half: summary") < lines.index("## Held-out third: summary")
    assert "Architectures (held out: gpt2; development: bert)." in lines
    bert = next(r for r in data["rows"] if r["file"] == "bert.onnx")
    row = next(line for line in lines if line.startswith("| tiny prefill |"))
    assert row.startswith("| tiny prefill | 1 | 1 | 1 |") and f"| {bert['ratio']:.3f} (1) |" in row
    assert any(line.startswith("| decoding (all sizes) | 1 |") for line in lines)
    assert "| tiny | opt_dynamo18_sdpa_dynamic_decode | <class 'X'>: no \\| way |" in lines
    assert "| bert | encoder |  | 1 / 0 | 0 / 0 | 1 |" in lines  # architecture, family, held out, made, failed, ran
    assert "| opt | decoder | yes | 0 / 0 | 1 / 0 | 0 |" in lines
    assert sum(line.startswith("| bert | 66 / ") for line in lines) == 1
    # no calibration cached for this machine: the shipped one priced the predictions, and the header says so
    shipped = cal.shipped("onnxruntime")
    assert (f"; predictions priced by the shipped calibration ({shipped.machine['cpu']}; made by: "
            f"{shipped.command}); ") in lines[0]


def test_reports_of_earlier_runs_merge_each_export_once(result: tuple[dict, str, Path]) -> None:
    _, text, out = result
    rows = str(out / "rows.json")
    assert corpus.main(["--from-json", rows, "--from-json", rows, "--markdown", str(out / "merged.md")]) == 0
    merged = (out / "merged.md").read_text().splitlines()
    first = text.splitlines()
    assert merged[1:] == first[1:]  # the same rows; the first line adds the second run's minutes
    minutes = first[0].rsplit("; ", 1)[1]
    assert merged[0].endswith(f"; {minutes.removesuffix(' minutes.')} + {minutes}")


def test_merged_reports_name_the_timed_runs_of_the_runs_that_measured_each_size(
        result: tuple[dict, str, Path]) -> None:
    data, _, out = result
    real_row = next(r for r in data["rows"] if r["file"] == "bert.onnx") | {"size": "real"}
    corpus_ = data["corpora"][0]
    real = {"run": data["run"] | {"runs": 7, "real_runs": 10},
            "corpora": [corpus_ | {"size": "real", "exports": [corpus_["exports"][0] | {"size": "real"}]}],
            "rows": [real_row]}
    (out / "real.json").write_text(json.dumps(real))
    assert data["run"]["runs"] == 3 and data["run"]["real_runs"] == 20  # the tiny run's settings
    assert corpus.main(["--from-json", str(out / "rows.json"), "--from-json", str(out / "real.json"),
                        "--markdown", str(out / "both.md")]) == 0
    first = (out / "both.md").read_text().splitlines()[0]
    assert "latency: median of 3 runs (10 at real size)," in first


def test_a_dynamic_export_ours_cannot_import_with_symbols_is_measured_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    onnx.save(MODELS["bert"](), tmp_path / "bert.onnx")
    entry = _entry("bert.onnx", "bert", False, [{"hidden_states": [2, 5, 16], "attention_mask": [2, 5]},
                                                {"hidden_states": [3, 9, 16], "attention_mask": [3, 9]}],
                   {"batch": 2, "sequence": 5})
    real_import = corpus.import_model

    def symbols_fail(model: object, input_shapes: object = None) -> object:
        if input_shapes is None:
            raise OnnxImportError("Slice node 's': cannot decide sequence > 8")
        return real_import(model, input_shapes)

    monkeypatch.setattr(corpus, "import_model", symbols_fail)
    optimizer = corpus.TransformerOptimizer(str(tmp_path / "no-python"), tmp_path / "log")
    args = (entry, tmp_path, tmp_path, optimizer, corpus.ours_here, 3)
    unbound = corpus.measure(*args)
    assert unbound["ours"]["error"] == "import: OnnxImportError: Slice node 's': cannot decide sequence > 8"
    assert "bound" not in unbound and unbound["ratio"] is None and "ms" not in unbound["runs"][0]
    row = corpus.measure(*args, bind=frozenset({"tiny"}))
    optimizer.close()
    assert row["ours"] == unbound["ours"] and row["ratio"] is None and set(row["targets"].values()) == {False}
    bound = row["bound"]
    assert [r["shapes"]["attention_mask"] for r in row["runs"]] == [[2, 5]]  # bound: the first shape only
    assert bound["parity"] <= 1e-4 and bound["ratio"] == pytest.approx(row["runs"][0]["ms"]["ours"]
                                                                      / row["reference_ms"])
    line = corpus.table([row])[-1]
    assert f"| {bound['ratio']:.3f} (bound) |" in line and "symbolic: import: OnnxImportError" in line


def test_a_transformer_optimizer_that_dies_is_reported_and_started_again(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nread job\nkill -9 $$\n")  # dies on its first job, as under the OOM killer
    fake.chmod(0o755)
    optimizer = corpus.TransformerOptimizer(str(fake), tmp_path / "log")
    entry = _entry("m.onnx", "m", False, [], {})
    first_pid = optimizer.proc.pid
    first = optimizer.run(entry, tmp_path / "m.onnx", tmp_path, timeout=60)
    second = optimizer.run(entry, tmp_path / "m.onnx", tmp_path, timeout=60)
    optimizer.close()
    assert first == second == dict.fromkeys(("0", "1", "99"), "the transformer optimizer stopped (killed by signal 9)")
    assert optimizer.proc.pid != first_pid

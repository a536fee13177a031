"""What the ONNX exporter writes, byte for byte: a SHA-256 of each exported model, compared with
``tests/export_fingerprints.json``.

The models: every fused op written as an onnxruntime kernel on sampled instances (every branch of its export
function that the samples reach), the example models and the static ONNX test models optimized for the shipped
``onnxruntime`` target, and two decoding steps (KvCacheAttention, GroupQueryAttention).  A change of the export
code, the rules or the cost model that changes a written model fails here, naming it; moving code must not.
When the change is meant, rewrite the file: ``.venv/bin/python tests/test_export_fingerprints.py`` (which also
records the fused ops added since).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnx_models import MODELS, decode_step
from rlx_egraph import Graph, examples, optimize
from rlx_egraph.cost import TARGETS
from rlx_egraph.cost.targets import ONNXRUNTIME_FUSED
from rlx_egraph.ir import op_spec
from rlx_egraph.onnx import export_model, import_model

FILE = Path(__file__).with_name("export_fingerprints.json")
SAMPLES = 4  # sampled instances per fused op
EXPORTED_OPS = sorted(ONNXRUNTIME_FUSED)  # the fused ops written as onnxruntime kernels


def _fused_op(op: str) -> list[Graph]:
    """``SAMPLES`` graphs of one node of ``op`` on sampled inputs (seeded by the op's name)."""
    rng = np.random.default_rng(list(op.encode()))
    spec, graphs = op_spec(op), []
    for _ in range(SAMPLES):
        types, attrs = spec.sample(rng)
        g = Graph(op)
        node = g.add_node(op, [g.input(f"in{k}", t.shape, t.dtype) for k, t in enumerate(types)], **attrs)
        g.set_outputs([g.get(node, index=k) for k in range(len(spec.results))] if spec.results else [node])
        graphs.append(g)
    return graphs


def _example(build: Callable[[], Graph]) -> Callable[[], list[Graph]]:
    """An example model (seeded weights) optimized for the shipped onnxruntime target."""

    def graphs() -> list[Graph]:
        g = build()
        rng = np.random.default_rng(0)
        for p in g.params:
            g.weights[p.name] = (0.1 * rng.standard_normal(p.shape)).astype(np.float32)
        return [optimize(g, target=TARGETS["onnxruntime"])]

    return graphs


def _onnx(build: Callable[[], object]) -> Callable[[], list[Graph]]:
    """An ONNX test model imported and optimized for the shipped onnxruntime target."""
    return lambda: [optimize(import_model(build()), target=TARGETS["onnxruntime"])]


CASES: dict[str, Callable[[], list[Graph]]] = {
    **{f"op:{op}": (lambda op=op: _fused_op(op)) for op in EXPORTED_OPS},
    **{f"example:{name}": _example(getattr(examples, name)) for name in ("mlp", "llama", "bert", "gpt2", "conv_block")},
    **{f"onnx:{name}": _onnx(build) for name, build in MODELS.items()},
    "onnx:decode": _onnx(lambda: decode_step(4)),
    "onnx:decode-gqa": _onnx(lambda: decode_step(4, grouped_query=True)),
}


def fingerprint(case: str) -> str:
    """The SHA-256 of the exported models of ``case``, serialized deterministically one after the other."""
    digest = hashlib.sha256()
    for g in CASES[case]():
        digest.update(export_model(g).SerializeToString(deterministic=True))
    return digest.hexdigest()


RECORDED: dict[str, str] = json.loads(FILE.read_text())


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_the_exported_model_is_as_recorded(case: str) -> None:
    assert case in CASES, f"{case} is recorded but is no case any more: rewrite {FILE.name} (see the module docstring)"
    assert fingerprint(case) == RECORDED[case], f"{case}: the exported ONNX changed"


def test_every_model_is_recorded() -> None:
    """Every model case is compared; a fused op added since the file was written is compared once recorded."""
    assert sorted(case for case in CASES if not case.startswith("op:") and case not in RECORDED) == []


if __name__ == "__main__":
    FILE.write_text(json.dumps({case: fingerprint(case) for case in sorted(CASES)}, indent=1) + "\n")
    sys.exit(0)

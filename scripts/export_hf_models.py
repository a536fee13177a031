"""Export tiny randomly initialised Hugging Face models to ONNX, outside the test suite.

BertModel, GPT2Model, LlamaModel, T5Model and ViTModel (hidden 64, 4 heads, 2 layers), built offline from
configs, every parameter perturbed slightly (so no weight is exactly 0 or 1 and no fusion is decided by a
trivial value), each exported by the TorchScript exporter (``dynamo=False``) at opsets 14 and 17 and by the dynamo
exporter at opset 18, with both attention implementations (``eager`` and ``sdpa``):
``OUT/<model>_<exporter><opset>_<attn>.onnx``.

torch and transformers are not project dependencies; run in a separate environment with torch (CPU),
transformers, onnx, onnxscript (the dynamo exporter), onnxruntime and sympy (the transformer optimizer), e.g. a
Python 3.11 virtual environment PY311 (no network needed: models are built from configs):

    $PY311/bin/python scripts/export_hf_models.py OUT            # about 3 minutes on 2 cores
    PYTHONPATH=src python -m rlx_egraph.frontends.onnx.compare OUT --ort-python $PY311/bin/python \
        --num-heads 4 --hidden-size 64                           # then compare, in the project's environment

Also writes ``OUT/INDEX.md``: every file with its opset, inputs, node count and op histogram, and every
failed export with torch's innermost exception.  A failed export is reported and skipped; the exit status
is 1 when any failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx
import torch
import transformers as tf

EXPORTS = (("torchscript", 14), ("torchscript", 17), ("dynamo", 18))
"""(exporter, opset) pairs: both PyTorch exporters, each at the opsets it is used with."""

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128}


def configs() -> dict[str, tuple[type, object]]:
    """Model class and config of each exported model."""
    return {
        "bert": (tf.BertModel, tf.BertConfig(**SMALL, vocab_size=128, max_position_embeddings=64)),
        "gpt2": (tf.GPT2Model, tf.GPT2Config(n_embd=64, n_head=4, n_layer=2, vocab_size=128, n_positions=64)),
        "llama": (tf.LlamaModel, tf.LlamaConfig(**SMALL, num_key_value_heads=2, vocab_size=128,
                                                max_position_embeddings=64)),
        "t5": (tf.T5Model, tf.T5Config(d_model=64, num_heads=4, num_layers=2, d_ff=128, d_kv=16, vocab_size=128)),
        "vit": (tf.ViTModel, tf.ViTConfig(**SMALL, image_size=32, patch_size=8)),
    }


def example_inputs(name: str) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """Inputs (batch 2, sequence 8) and their dynamic axes."""
    if name == "vit":
        return {"pixel_values": torch.randn(2, 3, 32, 32)}, {"pixel_values": {0: "batch"}}
    ids = torch.randint(0, 128, (2, 8))
    inputs = {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.int64)}
    if name == "t5":
        inputs["decoder_input_ids"] = torch.randint(0, 128, (2, 8))  # not ids: dynamo would alias equal inputs
    return inputs, {k: {0: "batch", 1: "sequence"} for k in inputs}


def build(name: str, attn: str) -> torch.nn.Module:
    """The model with ``attn`` attention, every parameter multiplied by 1 + 0.01 * noise, in eval mode."""
    cls, config = configs()[name]
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.01 * torch.randn_like(p)).add_(0.001 * torch.randn_like(p))
    return model


class LastHiddenState(torch.nn.Module):
    """``model(**inputs).last_hidden_state`` with the inputs positional (the TorchScript exporter passes them so)."""

    def __init__(self, model: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        extra = {} if isinstance(self.model, tf.ViTModel) else {"use_cache": False}
        return self.model(**dict(zip(self.names, inputs, strict=True)), **extra).last_hidden_state


def export(name: str, exporter: str, opset: int, attn: str, out: Path) -> Path:
    """Write ``OUT/<name>_<exporter><opset>_<attn>.onnx``."""
    inputs, axes = example_inputs(name)
    model = LastHiddenState(build(name, attn), list(inputs))
    path = out / f"{name}_{exporter}{opset}_{attn}.onnx"
    kwargs = {"dynamo": exporter == "dynamo", "input_names": list(inputs), "output_names": ["last_hidden_state"],
              "opset_version": opset}
    if exporter == "dynamo":
        dims = {n: torch.export.Dim(n, max=64) for n in ("batch", "sequence")}  # named as TorchScript's are
        kwargs["dynamic_shapes"] = (tuple({d: dims[n] for d, n in axes[k].items()} for k in inputs),)  # *inputs
    else:
        kwargs["dynamic_axes"] = axes
    torch.onnx.export(model, tuple(inputs.values()), str(path), **kwargs)
    return path


def last_line(exc: Exception) -> str:
    """The innermost cause of an export failure, one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("<class")]
    return (causes[-1] if causes else f"{type(exc).__name__}: {lines[0] if lines else ''}")[:300]


def index(out: Path, wrote: list[Path], failures: list[str]) -> str:
    """INDEX.md: each file with its opset, inputs, node count and op histogram; each failure with its cause."""
    rows = ["| file | opset | inputs | nodes | ops |", "|---|---|---|---|---|"]
    for path in wrote:
        model = onnx.load(str(path), load_external_data=False)
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        ops: dict[str, int] = {}
        for node in model.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        histogram = ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
        inputs = ", ".join(i.name for i in model.graph.input)
        rows.append(f"| {path.name} | {opset} | {inputs} | {len(model.graph.node)} | {histogram} |")
    failed = [f"- {line}" for line in failures] or ["- none"]
    return "\n".join([
        "# Tiny Hugging Face exports", "",
        f"Made by `scripts/export_hf_models.py {out}` (torch {torch.__version__}, transformers {tf.__version__}).",
        "Hidden 64, 4 heads, 2 layers, batch 2 x sequence 8 example inputs (dynamic batch and sequence), every",
        "parameter perturbed; output `last_hidden_state`. Dynamo exports keep weights in `<file>.onnx.data`.", "",
        *rows, "", "## Failed exports", "",
        "Each with the innermost exception torch raised (the exporter failed, not the model or this script).", "",
        *failed, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default=",".join(configs()), help="comma-separated (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    wrote: list[Path] = []
    failures: list[str] = []
    for name in args.models.split(","):
        for exporter, opset in EXPORTS:
            for attn in ("eager", "sdpa"):
                try:
                    wrote.append(export(name, exporter, opset, attn, args.out))
                    print("wrote", wrote[-1])
                except Exception as exc:  # report every failure, keep exporting the others
                    failures.append(f"{name} {exporter}{opset} {attn}: {last_line(exc)}")
                    print("FAILED", failures[-1], file=sys.stderr)
    (args.out / "INDEX.md").write_text(index(args.out, wrote, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

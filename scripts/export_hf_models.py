"""Export tiny randomly initialised Hugging Face models to ONNX, outside the test suite.

BertModel, GPT2Model, LlamaModel, T5Model and ViTModel (hidden 64, 4 heads, 2 layers), built offline from
configs, every parameter perturbed slightly (so no weight is exactly 0 or 1 and no fusion is decided by a
trivial value), each exported with both exporters (TorchScript ``dynamo=False`` and ``dynamo=True``) and both
attention implementations (``eager`` and ``sdpa``): ``OUT/<model>_<exporter>_<attn>.onnx``.

torch and transformers are not project dependencies; run in a separate Python 3.11 environment:

    python3.11 -m venv /tmp/hf && /tmp/hf/bin/pip install /opt/wheels/torch-*-cp311-*.whl transformers onnx
    /tmp/hf/bin/python scripts/export_hf_models.py OUT
    python -m rlx_egraph.frontends.onnx.compare OUT      # then compare, in the project's environment

A failed export is reported and skipped; the exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers as tf

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
        inputs["decoder_input_ids"] = ids
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


def export(name: str, exporter: str, attn: str, out: Path) -> Path:
    model = build(name, attn)
    inputs, axes = example_inputs(name)
    path = out / f"{name}_{exporter}_{attn}.onnx"
    kwargs = {"dynamo": exporter == "dynamo", "input_names": list(inputs), "output_names": ["last_hidden_state"],
              "opset_version": 18 if exporter == "dynamo" else 14}
    if exporter == "dynamo":
        kwargs["dynamic_shapes"] = {k: {d: torch.export.Dim.AUTO for d in v} for k, v in axes.items()}
    else:
        kwargs["dynamic_axes"] = axes
    torch.onnx.export(model, (), str(path), kwargs=inputs, **kwargs)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default=",".join(configs()), help="comma-separated (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.models.split(","):
        for exporter in ("torchscript", "dynamo"):
            for attn in ("eager", "sdpa"):
                try:
                    print("wrote", export(name, exporter, attn, args.out))
                except Exception as exc:  # report every failure, keep exporting the others
                    failed += 1
                    print(f"FAILED {name} {exporter} {attn}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

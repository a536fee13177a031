"""Export a corpus of randomly initialised Hugging Face models to ONNX, outside the test suite.

33 architectures from ``transformers`` (:data:`ARCHITECTURES`: encoders, decoders, encoder-decoders, vision
transformers, speech and convolutional models), built offline from configs, every parameter perturbed slightly
(no weight exactly 0 or 1, so no fusion is decided by a trivial value).  Each is exported

* by the TorchScript exporter (``dynamo=False``, opset 17) and the dynamo exporter (``dynamo=True``, opset 18);
* with ``eager`` and, where the model has it, ``sdpa`` attention;
* with static shapes and with dynamic axes (batch and sequence; images: batch; audio: batch and samples);
* as a prefill (the whole sequence, no cache) and, for decoders, as one decoding step with a KV cache
  (``past_key_values.<layer>.key/value`` in, ``present.<layer>.key/value`` out, sequence 1);

at ``tiny`` size (hidden 64, 4 heads, 2 layers) and, for four of them, at ``real`` size (bert-base,
gpt2-small, a 4-layer Llama-style model with hidden 2048 and grouped-query attention, vit-base; both exporters,
sdpa, dynamic axes).  Output: ``OUT/<size>/<arch>_<exporter><opset>_<attn>_<axes>_<kind>.onnx``; dynamo
exports and real-size models keep their weights in ``<file>.onnx.data``.

Every ``OUT/<size>`` folder gets ``INDEX.md`` (each file with its inputs, node count and op histogram; each
failed export with torch's innermost exception) and ``corpus.json``, which the comparison reads: per file the
architecture, family, whether it is held out, the variant, the input shapes to run it at (two for dynamic
exports, three past lengths for dynamic decoding steps), the symbolic dims' hint values and what the
transformer optimizer needs (model type, heads, hidden size).  A failed export is reported and skipped; the
exit status is 1 when any failed.

Held out: a third of the architectures, fixed here before any rule was written against them, is marked
``held_out``: per family, round(n / 3) of the architectures other than the five the rules were first written
against (bert, gpt2, llama, t5, vit), the first in the order of the SHA-256 of their names.

torch and transformers are not project dependencies; run in a separate environment with torch (CPU),
transformers, onnx, onnxscript (the dynamo exporter), onnxruntime and sympy (the transformer optimizer), made
with ``pip install torch==2.13.0 transformers onnx onnxscript onnxruntime sympy`` (no network needed to build
the models):

    VENV/bin/python scripts/export_hf_models.py OUT                # tiny and real
    VENV/bin/python scripts/export_hf_models.py OUT --sizes tiny --archs bert,llama
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
import transformers as tf

EXPORTERS = (("torchscript", 17), ("dynamo", 18))
"""(exporter, opset) pairs."""

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
        "vocab_size": 128, "max_position_embeddings": 128}
TINY_GQA = {**TINY, "num_key_value_heads": 2}
TINY_SEQ2SEQ = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
                "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 128}
TINY_IMAGE = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
              "image_size": 32, "patch_size": 8}


@dataclass(frozen=True)
class Arch:
    """One architecture: its model class, tiny config, inputs and what the comparison needs to know."""

    name: str
    family: str  # encoder | decoder | encoder-decoder | speech | vision | conv
    model: str  # the transformers class
    config: Callable[[], object]
    inputs: str  # text | text2text | image | audio | speech2text
    ort_type: str  # the transformer optimizer's model_type
    held_out: bool = False
    heads: int = 4
    hidden: int = 64


def _c(name: str, **kwargs: object) -> Callable[[], object]:
    return lambda: getattr(tf, name)(**kwargs)


ARCHITECTURES = (
    Arch("bert", "encoder", "BertModel", _c("BertConfig", **TINY), "text", "bert"),
    Arch("roberta", "encoder", "RobertaModel", _c("RobertaConfig", **{**TINY, "max_position_embeddings": 130}),
         "text", "bert"),
    Arch("distilbert", "encoder", "DistilBertModel",
         _c("DistilBertConfig", dim=64, n_heads=4, n_layers=2, hidden_dim=128, vocab_size=128,
            max_position_embeddings=128), "text", "bert", held_out=True),
    Arch("albert", "encoder", "AlbertModel", _c("AlbertConfig", **TINY, embedding_size=32), "text", "bert"),
    Arch("electra", "encoder", "ElectraModel", _c("ElectraConfig", **TINY, embedding_size=32), "text", "bert"),
    Arch("deberta-v2", "encoder", "DebertaV2Model",
         _c("DebertaV2Config", **TINY, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=32,
            position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True), "text", "bert"),
    Arch("clip-text", "encoder", "CLIPTextModel", _c("CLIPTextConfig", **{**TINY, "max_position_embeddings": 64},
                                                     pad_token_id=0, bos_token_id=1, eos_token_id=2),
         "text", "clip", held_out=True),
    Arch("gpt2", "decoder", "GPT2Model", _c("GPT2Config", n_embd=64, n_head=4, n_layer=2, vocab_size=128,
                                             n_positions=128, bos_token_id=0, eos_token_id=0), "text", "gpt2"),
    Arch("gpt-neo", "decoder", "GPTNeoModel",
         _c("GPTNeoConfig", hidden_size=64, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]],
            window_size=8, vocab_size=128, max_position_embeddings=128, intermediate_size=128, bos_token_id=0,
            eos_token_id=0), "text", "gpt2"),
    Arch("gpt-j", "decoder", "GPTJModel", _c("GPTJConfig", n_embd=64, n_head=4, n_layer=2, rotary_dim=8,
                                             n_positions=128, vocab_size=128, n_inner=128, bos_token_id=0,
                                             eos_token_id=0), "text", "gpt2"),
    Arch("opt", "decoder", "OPTModel",
         _c("OPTConfig", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, ffn_dim=128,
            word_embed_proj_dim=64, vocab_size=128, max_position_embeddings=128), "text", "gpt2", held_out=True),
    Arch("bloom", "decoder", "BloomModel", _c("BloomConfig", hidden_size=64, n_head=4, n_layer=2, vocab_size=128),
         "text", "gpt2", held_out=True),
    Arch("falcon", "decoder", "FalconModel",
         _c("FalconConfig", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=128,
            max_position_embeddings=128, bos_token_id=0, eos_token_id=0), "text", "gpt2"),
    Arch("llama", "decoder", "LlamaModel", _c("LlamaConfig", **TINY_GQA), "text", "gpt2"),
    Arch("mistral", "decoder", "MistralModel", _c("MistralConfig", **TINY_GQA), "text", "gpt2", held_out=True),
    Arch("qwen2", "decoder", "Qwen2Model", _c("Qwen2Config", **TINY_GQA), "text", "gpt2"),
    Arch("phi", "decoder", "PhiModel", _c("PhiConfig", **TINY), "text", "gpt2", held_out=True),
    Arch("phi3", "decoder", "Phi3Model", _c("Phi3Config", **TINY_GQA, pad_token_id=0, bos_token_id=1,
                                             eos_token_id=2), "text", "gpt2"),
    Arch("gemma", "decoder", "GemmaModel", _c("GemmaConfig", **TINY_GQA, head_dim=16), "text", "gpt2",
         held_out=True),
    Arch("stablelm", "decoder", "StableLmModel", _c("StableLmConfig", **TINY_GQA), "text", "gpt2"),
    Arch("gpt-neox", "decoder", "GPTNeoXModel", _c("GPTNeoXConfig", **TINY, bos_token_id=0, eos_token_id=0),
         "text", "gpt_neox"),
    Arch("mpt", "decoder", "MptModel", _c("MptConfig", d_model=64, n_heads=4, n_layers=2, expansion_ratio=2,
                                          vocab_size=128, max_seq_len=128), "text", "gpt2"),
    Arch("t5", "encoder-decoder", "T5Model",
         _c("T5Config", d_model=64, num_heads=4, num_layers=2, d_ff=128, d_kv=16, vocab_size=128), "text2text", "t5"),
    Arch("bart", "encoder-decoder", "BartModel", _c("BartConfig", **TINY_SEQ2SEQ, max_position_embeddings=128),
         "text2text", "bart", held_out=True),
    Arch("marian", "encoder-decoder", "MarianModel",
         _c("MarianConfig", **TINY_SEQ2SEQ, max_position_embeddings=128, pad_token_id=0, decoder_start_token_id=0,
            eos_token_id=1, decoder_vocab_size=128), "text2text", "bart"),
    Arch("whisper", "speech", "WhisperModel",
         _c("WhisperConfig", **TINY_SEQ2SEQ, num_mel_bins=16, max_source_positions=32, max_target_positions=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3, suppress_tokens=[],
            begin_suppress_tokens=[]), "speech2text", "bart"),
    Arch("wav2vec2", "speech", "Wav2Vec2Model",
         _c("Wav2Vec2Config", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
            vocab_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), "audio", "bert", held_out=True),
    Arch("vit", "vision", "ViTModel", _c("ViTConfig", **TINY_IMAGE), "image", "vit"),
    Arch("deit", "vision", "DeiTModel", _c("DeiTConfig", **TINY_IMAGE), "image", "vit"),
    Arch("swin", "vision", "SwinModel",
         _c("SwinConfig", image_size=32, patch_size=2, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4),
         "image", "swin", held_out=True, heads=2, hidden=32),
    Arch("convnext", "conv", "ConvNextModel",
         _c("ConvNextConfig", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], image_size=32), "image", "bert",
         held_out=True),
    Arch("resnet", "conv", "ResNetModel",
         _c("ResNetConfig", embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]), "image", "bert"),
    Arch("mobilenet-v2", "conv", "MobileNetV2Model",
         _c("MobileNetV2Config", depth_multiplier=0.35, image_size=32), "image", "bert"),
)
"""The corpus's architectures at tiny size.  ``held_out``: see the module docstring."""

REAL = {
    "bert": (_c("BertConfig"), 12, 768),
    "gpt2": (_c("GPT2Config"), 12, 768),
    "llama": (_c("LlamaConfig", hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                 num_attention_heads=32, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048), 32,
              2048),
    "vit": (_c("ViTConfig"), 12, 768),
}
"""Real-size configs (bert-base, gpt2-small, a 4-layer Llama-style model with GQA, vit-base), heads, hidden."""


@dataclass(frozen=True)
class Shapes:
    """The example (primary) sizes of a size class, and the other sizes a dynamic export is run at."""

    batch: int
    sequence: int
    image: int
    samples: int
    past: int
    other: tuple[tuple[int, int], ...]  # (batch, sequence or samples or past) of further runs
    max_sequence: int


SIZES = {
    "tiny": Shapes(batch=2, sequence=16, image=32, samples=1600, past=16, other=((3, 33),), max_sequence=64),
    "real": Shapes(batch=1, sequence=128, image=224, samples=16000, past=128, other=((2, 64),), max_sequence=512),
}
PAST_LENGTHS = {"tiny": ((3, 48), (1, 96)), "real": ((1, 512),)}
"""Past lengths a dynamic decoding step also runs at, (batch, past), after the primary one."""


def build(arch: Arch, size: str, attn: str) -> torch.nn.Module:
    """The model with ``attn`` attention, every parameter multiplied by 1 + 0.01 * noise, in eval mode."""
    config = arch.config() if size == "tiny" else REAL[arch.name][0]()
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = getattr(tf, arch.model)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.01 * torch.randn_like(p)).add_(0.001 * torch.randn_like(p))
    return model


def attentions(arch: Arch) -> tuple[str, ...]:
    """``eager`` and, where the model class has it, ``sdpa``."""
    return ("eager", "sdpa") if getattr(tf, arch.model)._supports_sdpa else ("eager",)


def _vocab(model: torch.nn.Module) -> int:
    return int(model.config.vocab_size) if hasattr(model.config, "vocab_size") else 0


def prefill_inputs(arch: Arch, model: torch.nn.Module, batch: int, n: int,
                   size: Shapes) -> tuple[dict[str, torch.Tensor], dict[str, dict[int, str]]]:
    """Prefill inputs (batch ``batch``, sequence/samples ``n``) and their dynamic axes."""
    gen = torch.Generator().manual_seed(0)
    vocab = _vocab(model)
    if arch.inputs == "image":
        channels = model.config.num_channels
        return ({"pixel_values": torch.randn(batch, channels, size.image, size.image, generator=gen)},
                {"pixel_values": {0: "batch"}})
    if arch.inputs == "audio":
        return {"input_values": torch.randn(batch, n, generator=gen)}, {"input_values": {0: "batch", 1: "samples"}}
    if arch.inputs == "speech2text":
        frames = 2 * model.config.max_source_positions
        return ({"input_features": torch.randn(batch, model.config.num_mel_bins, frames, generator=gen),
                 "decoder_input_ids": torch.randint(0, vocab, (batch, n), generator=gen)},
                {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: "decoder_sequence"}})
    inputs = {"input_ids": torch.randint(0, vocab, (batch, n), generator=gen),
              "attention_mask": torch.ones(batch, n, dtype=torch.int64)}
    axes = {k: {0: "batch", 1: "sequence"} for k in inputs}
    if arch.inputs == "text2text":  # not the same ids: dynamo would alias equal inputs
        inputs["decoder_input_ids"] = torch.randint(0, vocab, (batch, n), generator=gen)
        axes["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
    return inputs, axes


def _call(model: torch.nn.Module, named: dict[str, object], cache: object = None) -> object:
    extra: dict[str, object] = {}
    parameters = inspect.signature(model.forward).parameters
    if "use_cache" in parameters:
        extra["use_cache"] = cache is not None
    if cache is not None:
        extra["cache" if "cache" in parameters else "past_key_values"] = cache
    return model(**named, **extra)


def _cache_of(output: object) -> object:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def decode_inputs(model: torch.nn.Module, batch: int, past: int) -> tuple[dict[str, torch.Tensor], int]:
    """One decoding step's inputs after a prefill of ``past`` tokens: ids [batch, 1], mask [batch, past + 1]
    and the prefill's own cache as ``past_key_values.<layer>.key/value``; also the number of layers."""
    gen = torch.Generator().manual_seed(0)
    vocab = _vocab(model)
    with torch.no_grad():
        prefill = _call(model, {"input_ids": torch.randint(0, vocab, (batch, past), generator=gen),
                                "attention_mask": torch.ones(batch, past, dtype=torch.int64)},
                        tf.DynamicCache(config=model.config))
    layers = _cache_of(prefill).layers
    inputs = {"input_ids": torch.randint(0, vocab, (batch, 1), generator=gen),
              "attention_mask": torch.ones(batch, past + 1, dtype=torch.int64)}
    for i, layer in enumerate(layers):
        inputs[f"past_key_values.{i}.key"] = layer.keys.detach().clone()
        inputs[f"past_key_values.{i}.value"] = layer.values.detach().clone()
    return inputs, len(layers)


class Prefill(torch.nn.Module):
    """``model(**inputs).last_hidden_state`` with the inputs positional (the TorchScript exporter passes them so)."""

    def __init__(self, model: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return _call(self.model, dict(zip(self.names, inputs, strict=True))).last_hidden_state


class DecodeStep(torch.nn.Module):
    """One decoding step: ids, mask and the past keys and values in; the hidden state and the present out."""

    def __init__(self, model: torch.nn.Module, names: list[str], layers: int) -> None:
        super().__init__()
        self.model, self.names, self.layers = model, names, layers

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        named = dict(zip(self.names, inputs, strict=True))
        past = [(named.pop(f"past_key_values.{i}.key"), named.pop(f"past_key_values.{i}.value"))
                for i in range(self.layers)]
        out = _call(self.model, named, tf.DynamicCache(past, config=self.model.config))
        present = [t for layer in _cache_of(out).layers for t in (layer.keys, layer.values)]
        return (out.last_hidden_state, *present)


@dataclass
class Variant:
    """One export: which model, how, and at which shapes the comparison runs it."""

    arch: Arch
    size: str
    exporter: str
    opset: int
    attn: str
    dynamic: bool
    kind: str  # prefill | decode

    @property
    def file(self) -> str:
        axes = "dynamic" if self.dynamic else "static"
        return f"{self.arch.name}_{self.exporter}{self.opset}_{self.attn}_{axes}_{self.kind}.onnx"


def _shape_runs(variant: Variant, model: torch.nn.Module, shapes: Shapes) -> list[dict[str, list[int]]]:
    """The input shapes the comparison runs ``variant`` at: the example's, then (dynamic only) the others."""
    if variant.kind == "decode":
        sizes = [(shapes.batch, shapes.past), *(PAST_LENGTHS[variant.size] if variant.dynamic else ())]
        runs = []
        for batch, past in sizes:
            inputs, _ = decode_inputs(model, batch, past)
            runs.append({k: list(v.shape) for k, v in inputs.items()})
        return runs
    n = shapes.samples if variant.arch.inputs == "audio" else shapes.sequence
    sizes = [(shapes.batch, n), *((b, s * 50 if variant.arch.inputs == "audio" else s)
                                   for b, s in shapes.other if variant.dynamic)]
    return [{k: list(v.shape) for k, v in prefill_inputs(variant.arch, model, b, s, shapes)[0].items()}
            for b, s in sizes]


def export(variant: Variant, out: Path, write: bool = True) -> dict[str, object]:
    """Write ``variant`` to ``out`` (``write=False``: it is there already); its corpus.json entry."""
    shapes = SIZES[variant.size]
    model = build(variant.arch, variant.size, variant.attn)
    path = out / variant.file
    seconds = write_onnx(variant, model, path) if write else None
    runs = _shape_runs(variant, model, shapes)
    proto = onnx.load(str(path), load_external_data=False)
    hints: dict[str, int] = {}
    for info in proto.graph.input:
        for d, value in zip(info.type.tensor_type.shape.dim, runs[0].get(info.name, []), strict=False):
            if d.dim_param.isidentifier():  # not a derived dim ("past_sequence + 1")
                hints[d.dim_param] = value
    heads, hidden = (variant.arch.heads, variant.arch.hidden) if variant.size == "tiny" else REAL[variant.arch.name][1:]
    return {"file": variant.file, "arch": variant.arch.name, "family": variant.arch.family,
            "held_out": variant.arch.held_out, "size": variant.size, "exporter": variant.exporter,
            "opset": variant.opset, "attn": variant.attn, "axes": "dynamic" if variant.dynamic else "static",
            "kind": variant.kind, "shapes": runs, "hints": hints, "vocab": _vocab(model),
            "ort_model_type": variant.arch.ort_type, "num_heads": heads, "hidden_size": hidden,
            "export_seconds": None if seconds is None else round(seconds, 2)}


def write_onnx(variant: Variant, model: torch.nn.Module, path: Path) -> float:
    """Export ``model`` as ``variant`` says to ``path``; the seconds it took."""
    shapes = SIZES[variant.size]
    if variant.kind == "decode":
        inputs, layers = decode_inputs(model, shapes.batch, shapes.past)
        wrapped: torch.nn.Module = DecodeStep(model, list(inputs), layers)
        outputs = ["last_hidden_state", *(f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value"))]
        axes = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "total_sequence"}}
        axes |= {k: {0: "batch", 2: "past_sequence"} for k in inputs if k.startswith("past_key_values")}
    else:
        n = shapes.samples if variant.arch.inputs == "audio" else shapes.sequence
        inputs, axes = prefill_inputs(variant.arch, model, shapes.batch, n, shapes)
        wrapped, outputs = Prefill(model, list(inputs)), ["last_hidden_state"]
    kwargs: dict[str, object] = {"dynamo": variant.exporter == "dynamo", "input_names": list(inputs),
                                 "output_names": outputs, "opset_version": variant.opset}
    if variant.dynamic and variant.exporter == "dynamo":
        dims = {name: torch.export.Dim(name, min=2, max=shapes.max_sequence * (200 if name == "samples" else 1))
                for name in ("batch", "sequence", "decoder_sequence", "samples")}
        dims["batch"] = torch.export.Dim("batch", min=1, max=64)
        dims["past_sequence"] = torch.export.Dim("past_sequence", min=1, max=4 * shapes.max_sequence)
        dims["total_sequence"] = dims["past_sequence"] + 1
        kwargs["dynamic_shapes"] = (tuple({d: dims[n] for d, n in axes.get(k, {}).items()} for k in inputs),)
    elif variant.dynamic:
        kwargs["dynamic_axes"] = axes
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, tuple(inputs.values()), str(path), **kwargs)
    if variant.size == "real" and variant.exporter == "torchscript":  # weights beside the model, as dynamo's are
        proto = onnx.load(str(path))
        onnx.save(proto, str(path), save_as_external_data=True, location=f"{path.name}.data")
    return time.perf_counter() - started


def variants(archs: list[Arch], size: str) -> list[Variant]:
    """Every export of ``archs`` at ``size``: tiny gets every variant, real the dynamic sdpa ones."""
    out = []
    for arch in archs:
        decoder = arch.family == "decoder"
        for exporter, opset in EXPORTERS:
            for attn in attentions(arch) if size == "tiny" else ("sdpa",):
                for dynamic in (False, True) if size == "tiny" else (True,):
                    for kind in ("prefill", "decode") if decoder else ("prefill",):
                        out.append(Variant(arch, size, exporter, opset, attn, dynamic, kind))
    return out


def innermost(exc: BaseException) -> str:
    """The innermost cause of an export failure, one line."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("<class")]
    return (causes[-1] if causes else f"{type(exc).__name__}: {lines[0] if lines else ''}")[:300]


def _dims(info: onnx.ValueInfoProto) -> str:
    return ",".join(d.dim_param or str(d.dim_value) for d in info.type.tensor_type.shape.dim)


def index(out: Path, size: str, entries: list[dict[str, object]], failures: list[dict[str, str]],
          seconds: float) -> str:
    """INDEX.md of one size's folder."""
    rows = ["| file | held out | inputs | nodes | ops |", "|---|---|---|---|---|"]
    for entry in entries:
        model = onnx.load(str(out / str(entry["file"])), load_external_data=False)
        ops: dict[str, int] = {}
        for node in model.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        histogram = ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
        inputs = ", ".join(f"{i.name} [{_dims(i)}]" for i in model.graph.input)
        held = "yes" if entry["held_out"] else ""
        rows.append(f"| {entry['file']} | {held} | {inputs} | {len(model.graph.node)} | {histogram} |")
    failed = [f"- {f['file']}: {f['error']}" for f in failures] or ["- none"]
    shapes = SIZES[size]
    what = ("hidden 64, 4 heads, 2 layers (vision, conv and speech models of about that width)" if size == "tiny"
            else "bert-base, gpt2-small, a 4-layer Llama-style model (hidden 2048, 32 heads, 4 key/value heads), "
                 "vit-base")
    return "\n".join([
        f"# Hugging Face exports: {size}", "",
        f"Made by `scripts/export_hf_models.py OUT --sizes {size}` (torch {torch.__version__}, transformers "
        f"{tf.__version__}) in {seconds / 60:.1f} minutes.",
        f"Models: {what}; randomly initialised, every parameter perturbed; output `last_hidden_state` (decoding "
        f"steps also `present.<layer>.key/value`). Example inputs: batch {shapes.batch}, sequence {shapes.sequence}"
        f" (images {shapes.image}x{shapes.image}, audio {shapes.samples} samples, decoding: past {shapes.past}).",
        "`corpus.json` lists each file's variant and the shapes the comparison runs it at.", "",
        *rows, "", "## Failed exports", "",
        "Each with the innermost exception torch raised (the exporter failed, not the model or this script).", "",
        *failed, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sizes", default="tiny,real", help="comma-separated: tiny, real (default both)")
    parser.add_argument("--archs", default="", help="comma-separated architecture names (default: all)")
    parser.add_argument("--index-only", action="store_true",
                        help="export nothing: list the files already in OUT in corpus.json and INDEX.md")
    args = parser.parse_args(argv)
    wanted = set(args.archs.split(",")) - {""}
    unknown = wanted - {a.name for a in ARCHITECTURES}
    if unknown:
        parser.error(f"unknown architectures: {', '.join(sorted(unknown))}")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tf.logging.set_verbosity_error()
    status = 0
    for size in args.sizes.split(","):
        archs = [a for a in ARCHITECTURES if (not wanted or a.name in wanted) and (size == "tiny" or a.name in REAL)]
        folder = args.out / size
        folder.mkdir(parents=True, exist_ok=True)
        manifest = folder / "corpus.json"
        entries: list[dict[str, object]] = []
        failures: list[dict[str, str]] = []
        seconds: dict[str, float] = {}
        for arch in archs:
            started = time.perf_counter()
            for variant in variants([arch], size):
                if args.index_only and not (folder / variant.file).exists():
                    continue
                try:
                    entries.append(export(variant, folder, write=not args.index_only))
                    print(f"wrote {variant.file} ({entries[-1]['export_seconds']} s)", flush=True)
                except Exception as exc:  # report every failure, keep exporting the others
                    failures.append({"file": variant.file, "arch": arch.name, "family": arch.family,
                                     "held_out": arch.held_out, "error": innermost(exc)})
                    print(f"FAILED {variant.file}: {failures[-1]['error']}", file=sys.stderr, flush=True)
            if not args.index_only:
                seconds[arch.name] = round(time.perf_counter() - started, 1)
        # what an earlier run (or another running now) wrote of other architectures is kept
        done = {a.name for a in archs}
        old = json.loads(manifest.read_text()) if manifest.exists() else {}
        entries += [e for e in old.get("exports", []) if e["arch"] not in done]
        failures += [f for f in old.get("failures", []) if f["arch"] not in done or args.index_only]
        seconds |= {k: v for k, v in old.get("arch_seconds", {}).items() if k not in seconds}
        order = {a.name: i for i, a in enumerate(ARCHITECTURES)}
        entries.sort(key=lambda e: (order[e["arch"]], e["file"]))
        failures.sort(key=lambda f: (order[f["arch"]], f["file"]))
        manifest.write_text(json.dumps(
            {"size": size, "torch": torch.__version__, "transformers": tf.__version__,
             "arch_seconds": seconds, "exports": entries, "failures": failures}, indent=1))
        (folder / "INDEX.md").write_text(index(folder, size, entries, failures, sum(seconds.values())))
        status |= bool(failures)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Binding a model's input dims: what ``input_shapes`` (and ``--input-shape``) say about each dim.

Each dim of a binding is an int (the dim is fixed to it), or a symbol name (the dim stays symbolic under
that name), or ``"name=hint"`` (symbolic, priced at ``hint`` by the optimizer: a hint never fixes a dim).
:func:`bind_inputs` reads them against the model's inputs; every bad binding is an
:class:`~.errors.OnnxImportError` naming the input and the dim.  This module imports no onnx.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...ir.dims import NAME, Dim, parse, symbol
from ...ir.registry import ShapeError
from .errors import OnnxImportError

MAX_DIM_PARAM = 200  # characters of a dim_param read as a symbolic dim ("batch*sequence", "2*s0+1")
MAX_RANK = 64  # dims of a model input (numpy's limit)


@dataclass(frozen=True)
class DimBinding:
    """One dim as a binding gives it: ``value`` an int, or ``symbol`` a name (with an optional pricing ``hint``)."""

    value: int | None = None
    symbol: str | None = None
    hint: int | None = None

    def __str__(self) -> str:
        if self.symbol is None:
            return str(self.value)
        return self.symbol if self.hint is None else f"{self.symbol}={self.hint}"


def parse_dim(value: Any, where: str) -> DimBinding:
    """One dim of a binding: an int >= 0, a symbol name, or ``"name=hint"`` (hint an int >= 1); ``where`` names the
    input and dim for the OnnxImportError."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        if hasattr(value, "__index__") and not isinstance(value, bool):
            value = int(value)  # numpy integers
        else:
            raise OnnxImportError(f"{where}: {value!r} is not a dim (an int, a symbol name, or 'name=hint')")
    if isinstance(value, int):
        if value < 1:
            raise OnnxImportError(f"{where}: {value} is not a dim size (inputs take sizes >= 1)")
        return DimBinding(value=value)
    text = value.strip()
    if text.lstrip("-").isdigit():
        return parse_dim(int(text), where)
    name, sep, hint = text.partition("=")
    name, hint = name.strip(), hint.strip()
    if not NAME.fullmatch(name):
        raise OnnxImportError(f"{where}: {value!r} is neither a number nor a symbol name (a letter or _, then "
                              "letters, digits, _), optionally with '=hint'")
    if not sep:
        return DimBinding(symbol=name)
    if not hint.isdigit() or int(hint) < 1:
        raise OnnxImportError(f"{where}: the hint in {value!r} must be an int >= 1")
    return DimBinding(symbol=name, hint=int(hint))


@dataclass
class Bound:
    """What a binding makes of a model's inputs: each input's shape (ints and symbolic dims), its dims as the model
    names them, and the pricing hints the binding gives."""

    shapes: dict[str, tuple[Dim, ...]] = field(default_factory=dict)
    dim_names: dict[str, list[str | None]] = field(default_factory=dict)
    hints: dict[str, int] = field(default_factory=dict)
    related: dict[str, Dim] = field(default_factory=dict)  # dim_param -> the dim it is taken to be (decoding_length)


@dataclass(frozen=True)
class ModelInput:
    """A model input as the binding reads it: its name and its dims (an int, a dim_param, or None: unnamed); rank
    None when the model gives no shape."""

    name: str
    dims: tuple[int | str | None, ...] | None

    def written(self) -> tuple[str, ...]:
        """The dims as the model writes them: a number, a symbol's name, ``?`` where it has neither (or the name
        holds a space, which would split a command line, or is too long to be a dim)."""
        return tuple("?" if d is None or (isinstance(d, str) and (" " in d or len(d) > MAX_DIM_PARAM)) else str(d)
                     for d in self.dims or ())


def bind_inputs(inputs: Sequence[ModelInput], input_shapes: Mapping[str, Sequence[Any]]) -> Bound:
    """Shapes of ``inputs`` under ``input_shapes`` (input name -> dims, see :func:`parse_dim`).

    A model dim_param bound for one input (to a size or a symbol name) is bound for every input; one left unbound
    stays a symbolic dim of that name.  OnnxImportError names the input and dim of each bad binding.
    """
    by_name = {i.name: i for i in inputs}
    unknown = sorted(set(input_shapes) - set(by_name))
    if unknown:
        raise OnnxImportError(f"input_shapes names {unknown}, which are not inputs of the model "
                              f"({', '.join(repr(n) for n in by_name)})")
    given: dict[str, list[DimBinding]] = {}
    for name, dims in input_shapes.items():
        if isinstance(dims, str | bytes) or not isinstance(dims, Sequence):
            raise OnnxImportError(f"input {name!r}: input_shapes gives {dims!r}, not a sequence of dims")
        model = by_name[name]
        given[name] = [parse_dim(d, f"input {name!r}: dimension {k}") for k, d in enumerate(dims)]
        if model.dims is not None and len(given[name]) != len(model.dims):
            raise OnnxImportError(f"input {name!r}: input_shapes gives rank {len(given[name])} "
                                  f"[{', '.join(map(str, given[name]))}], the model's input has rank {len(model.dims)}")
    for model in inputs:
        if model.dims is not None and len(model.dims) > MAX_RANK:
            raise OnnxImportError(f"input {model.name!r} has rank {len(model.dims):,}, more than the {MAX_RANK} dims "
                                  "a tensor may have")
    out = Bound(related=decoding_length(inputs, given))
    params: dict[str, tuple[DimBinding, str]] = {}  # model dim_param -> its binding, and where it was given
    for name, dims in given.items():
        model = by_name[name]
        for axis, b in enumerate(dims):
            where = f"input {name!r}: dimension {axis}"
            have = model.dims[axis] if model.dims is not None else None
            if isinstance(have, int) and b != DimBinding(value=have):
                raise OnnxImportError(f"{where} is fixed to {have} in the model, input_shapes gives {b}")
            if isinstance(have, str):
                first = params.setdefault(have, (b, where))
                if (first[0].value, first[0].symbol) != (b.value, b.symbol):
                    raise OnnxImportError(f"{where} {have!r} is bound to {b} here and to {first[0]} by "
                                          f"{first[1]}")
            if b.symbol is not None and b.hint is not None and out.hints.setdefault(b.symbol, b.hint) != b.hint:
                raise OnnxImportError(f"{where}: symbol {b.symbol!r} is hinted {b.hint} here and "
                                      f"{out.hints[b.symbol]} elsewhere")
    for model in inputs:
        out.dim_names[model.name] = [d if isinstance(d, str) else None for d in model.dims or ()]
        if model.dims is None and model.name not in given:
            raise OnnxImportError(f"input {model.name!r}: the model gives it no shape", f"pass input_shapes="
                                  f"{{{model.name!r}: (...)}}", {model.name: ()})
        shape = []
        for axis, have in enumerate(model.dims if model.dims is not None else given[model.name]):
            b = given[model.name][axis] if model.name in given else None
            if isinstance(have, DimBinding):  # no model shape: the binding is the shape
                have = None
            if b is None and isinstance(have, str) and have in params:
                b = params[have][0]
            if b is not None:
                shape.append(b.value if b.symbol is None else symbol(b.symbol))
            elif isinstance(have, int):
                shape.append(have)
            elif isinstance(have, str) and have in out.related:
                shape.append(out.related[have])
            elif isinstance(have, str):
                shape.append(_symbolic_dim(model, axis, have))
            else:
                raise OnnxImportError(f"input {model.name!r}: dimension {axis} (unnamed) has no binding",
                                      f"pass input_shapes={{{model.name!r}: (...)}} with a size or a symbol name "
                                      "for it", {model.name: model.written()})
        if any(isinstance(d, int) and d < 1 for d in shape):
            raise OnnxImportError(f"input {model.name!r}: shape {shape} must hold dims >= 1 (a size-0 input is not "
                                  "supported)")
        out.shapes[model.name] = tuple(shape)
    return out


def decoding_length(inputs: Sequence[ModelInput], given: Mapping[str, Sequence[DimBinding]]) -> dict[str, Dim]:
    """The total length of a decoding step that the model names apart: ``{"total_sequence": past_sequence + S}``.

    A decoding step exported by TorchScript gives its attention mask ``[batch, total_sequence]``, a dim_param of its
    own, while its cache inputs (``past...``, rank 4) are ``[batch, heads, past_sequence, head_dim]`` and its tokens
    ``[batch, S]``; the step only runs when the mask covers the cached and the new tokens, so ``total_sequence`` is
    ``past_sequence + S``.  Taken when exactly one input is a rank-2 ``*mask*`` whose last dim is a dim_param no other
    input has, the rank-4 ``*past*`` inputs share one dim_param on axis 2, one other rank-2 input (the token ids) has
    the mask's first dim, and the binding names none of these inputs; empty otherwise.
    """
    def dims(i: ModelInput) -> tuple[int | str | None, ...]:
        return i.dims or ()

    masks = [i for i in inputs if "mask" in i.name.lower() and len(dims(i)) == 2]
    past = {dims(i)[2] for i in inputs if "past" in i.name.lower() and len(dims(i)) == 4}
    if len(masks) != 1 or len(past) != 1 or not isinstance(cached := next(iter(past)), str):
        return {}
    mask = masks[0]
    total = dims(mask)[1]
    tokens = [i for i in inputs if i is not mask and len(dims(i)) == 2 and dims(i)[0] == dims(mask)[0]]
    if (not isinstance(total, str) or not NAME.fullmatch(total) or total == cached or len(tokens) != 1 or set(given) & {
            i.name for i in inputs if i is mask or i is tokens[0] or cached in dims(i)}
            or any(total in dims(i) for i in inputs if i is not mask)):
        return {}
    new = dims(tokens[0])[1]
    if new is None or (isinstance(new, str) and not NAME.fullmatch(new)) or not NAME.fullmatch(cached):
        return {}
    return {total: symbol(cached) + (new if isinstance(new, int) else symbol(new))}


def _symbolic_dim(model: ModelInput, axis: int, dim_param: str) -> Dim:
    """The symbolic dim an unbound ``dim_param`` stands for; OnnxImportError when it is not one (or is longer than
    :data:`MAX_DIM_PARAM` characters: no export names a dim so)."""
    if len(dim_param) > MAX_DIM_PARAM:
        raise OnnxImportError(f"input {model.name!r}: dimension {axis} has a dim_param of {len(dim_param):,} "
                              f"characters, more than the {MAX_DIM_PARAM} a symbolic dim may have",
                              f"pass input_shapes={{{model.name!r}: (...)}}", {model.name: model.written()})
    try:
        dim = parse(dim_param)
    except ShapeError as exc:
        dim, why = None, str(exc)
    else:
        why = "it is a number"
    if dim is None or isinstance(dim, int):
        raise OnnxImportError(f"input {model.name!r}: dimension {axis} {dim_param!r} is not a symbolic dim ({why})",
                              f"pass input_shapes={{{model.name!r}: (...)}}", {model.name: model.written()})
    return dim


__all__ = ["MAX_DIM_PARAM", "MAX_RANK", "Bound", "DimBinding", "ModelInput", "bind_inputs", "decoding_length",
           "parse_dim"]

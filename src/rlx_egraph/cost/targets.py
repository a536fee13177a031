"""Cost targets: the knobs that turn an IO profile into predicted nanoseconds.

A :class:`Target` prices the counts of :mod:`rlx_egraph.cost.model`::

    ns = launches * dispatch_ns + syncs * (roundtrip_ns + host_thunk_penalty_ns)
       + traffic_bytes / memory_bw + readback_bytes / readback_bw + flops / flops_per_ns

Bandwidths are in bytes per ns (1 B/ns = 1 GB/s) and compute in FLOP per ns
(1 FLOP/ns = 1 GFLOP/s).  A target with measured lines (``rates``) prices the
launches, bytes and FLOPs of an op's nodes by its op's or kind's line instead,
and adds ``run_ns`` per run (:meth:`Target.rate`).  An op in ``unsupported``
costs infinity on that target, so extraction never picks it (legalisation by
extraction).

Where the preset figures come from:

``metal`` and ``wgpu``
    The seed design's compile-time gate figures, unchanged, so
    its gate decisions reproduce.  The seed does not model compute, so both
    have ``flops_per_ns = inf``.  On unified memory the seed divides readback
    by its readback bandwidth forced to 0 and then clamped to 1, i.e. it
    charges 1 ns per byte; ``metal`` keeps that as the explicit knob
    ``unified_readback_bw = 1.0``.  ``wgpu`` lacks ``FusedTransformerLayer``
    and ``ElementwiseRegion``: in the seed's design that backend has no native
    kernel for a whole transformer layer and no region-kernel codegen (its
    regions are unfused back into single ops), so those ops must never be
    extracted for it.

``cpu`` (ours; a 2-core x86 host such as this project's machine)
    dispatch 3 µs: a numpy ufunc call costs ~0.7 µs and this project's
    Python interpreter ~6 µs per node; a native runtime's function call plus
    thread-pool hand-off sits between.  memory_bw 20 B/ns: a 2-channel DRAM
    stream (a 64 MiB ``np.copyto`` measured ~24 B/ns here).  There is no
    separate device: roundtrip and host-thunk penalty are 0 and outputs are read
    at memory speed (``unified``, 20 B/ns).  flops_per_ns 100: float32 BLAS
    measured 95 GFLOP/s on a 32x256x256 matmul and 150-195 GFLOP/s on large
    ones (two AVX2 FMA cores); non-BLAS kernels reach far less, and the figure
    only has to rank compute against IO.

``cuda`` (ours; a current NVIDIA data-centre or high-end GPU)
    dispatch 5 µs: ``cudaLaunchKernel`` host cost plus the gap between
    dependent kernels.  roundtrip 20 µs: ``cudaStreamSynchronize`` plus a small
    device-to-host copy.  memory_bw 1000 B/ns: HBM/GDDR6X at ~1 TB/s (RTX 4090
    1.0, A100 1.6-2.0, H100 2-3.3 TB/s).  host_readback_bw 25 B/ns: PCIe 4.0
    x16 (32 GB/s raw, ~25 GB/s pinned copies).  flops_per_ns 20 000: ~20 TFLOP/s
    non-tensor-core float32 (A100 19.5).  host_thunk_penalty 100 µs: a host
    callback drains the stream and breaks CUDA-graph capture.

``onnxruntime`` (ours; onnxruntime's CPU provider)
    Priced by a :class:`~rlx_egraph.cost.calibration.Calibration`: per op (or op kind) a cost line fitted
    to measurements in onnxruntime of what the ONNX export writes for it, at sizes from a tiny model's to
    BERT-base's, plus the fixed cost of one run.  :func:`onnxruntime_target` builds it from a calibration;
    :func:`get_target` takes this machine's (``rlx-egraph calibrate --target onnxruntime``, cached per
    machine), else the one shipped with the package.  It runs the fused ops of :data:`ONNXRUNTIME_FUSED`
    (each exported as the onnxruntime kernel named there; every other fused op would be exported unfused,
    so extraction must not pick it) and no region kernels.  Whether a fused kernel pays is decided by its
    measured line against its parts' at the node's shape (``docs/cost_model.md``).  The layout ops
    (:data:`ORT_LAYOUTS`) are kernels there when they read an intermediate (a Reshape dispatched without a
    copy, the others copying; over weights onnxruntime folds them when the session loads), so each is
    priced by its measured line.

Symbolic dims (``"batch"``, ``"seq"``) are priced at a size hint: the call's
``dim_hints`` (``optimize(g, dim_hints={"seq": 512})``), else the target's
``dim_hints``, else its ``default_dim_hint`` (16 on every preset: a small batch
or a short sequence, where launch counts weigh most).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RlxError
from ..ir.ops.regions import REGION_KINDS
from ..ir.registry import REGISTRY, Kind, OpSpec, TensorType, TupleType
from . import calibration as cal
from .calibration import Calibration, OpRate
from .model import NodeCost, line_key, line_op, line_variant, names_a_line, node_cost, node_launches

if TYPE_CHECKING:
    from .profile import IoProfile

_NON_NEGATIVE = ("dispatch_ns", "roundtrip_ns", "host_thunk_penalty_ns", "run_ns", "value_ns", "value_ns_per_byte",
                 "stream_ns_per_byte", "cache_bytes", "shape_ns", "masked_row_ns")
_POSITIVE = ("memory_bw", "host_readback_bw", "unified_readback_bw", "flops_per_ns")
_COUNTS = ("region_max_steps", "region_max_inputs", "default_dim_hint")

# The longest ElementwiseRegion chain a region kernel runs, and the most inputs it reads.
REGION_MAX_STEPS = 16
REGION_MAX_INPUTS = 8
# The seed's bound on FusedAttentionBlock (batch*seq tokens), kept on targets with no measurement of it.
SEED_ATTENTION_BLOCK_MAX_TOKENS = 64
# Layout ops onnxruntime dispatches when they read an intermediate: Reshape (no copy), Slice, Transpose, Expand, Concat.
ORT_LAYOUTS = frozenset({"Reshape", "Narrow", "Transpose", "Expand", "Concat"})
# The fused ops the onnxruntime target runs, each with the onnxruntime kernel it runs as: every fused op that declares
# its ONNX export (OpSpec.onnx, in its family module), which the ONNX exporter writes as that kernel.
ONNXRUNTIME_FUSED: dict[str, str] = {name: spec.onnx.kernel for name, spec in REGISTRY.items()
                                     if spec.kind is Kind.FUSED and spec.onnx is not None}


class UnsupportedOp(RlxError, ValueError):
    """A node of the input graph whose value its target cannot compute: the target does not run the node's op,
    and no rule gives a way to compute the value with ops it runs."""


def unsupported_op(target: Target, nodes: Iterable[tuple[int, str]]) -> UnsupportedOp | None:
    """The error naming the first of ``nodes`` (input-graph (id, op) pairs, in graph order) whose op ``target``
    does not run; None when it runs them all."""
    nid, op = next(((nid, op) for nid, op in nodes if not target.supports(op)), (None, ""))
    if nid is None:
        return None
    return UnsupportedOp(f"node {nid} ({op}): target {target.name} does not run {op}, and no rule gives a way to "
                         "compute its value with ops it runs")


@dataclass(frozen=True, kw_only=True)
class Target:
    """One backend's cost knobs (immutable; derive variants with :meth:`replace`).

    ``unified_readback_bw`` is the readback bandwidth used when ``unified`` is
    true; its default 1.0 B/ns is the seed's effective figure (see the module
    docstring).  A host-sync point costs ``roundtrip_ns`` plus ``host_thunk_penalty_ns`` (the
    seed charged the penalty in its fusion gate; here it is part of the one cost every engine minimises).
    ``unsupported`` names the ops the target does not run: no kernel, or one measured slower than the ops it
    fuses.  ``region_kernels`` says whether the backend runs ElementwiseRegion natively, and
    ``region_max_steps`` / ``region_max_inputs`` bound the regions it runs.
    ``dim_hints`` (symbol -> size) and ``default_dim_hint`` (any other symbol) are the sizes symbolic dims are
    priced at (:meth:`hint`).
    ``rates`` (op name or kind -> :class:`~rlx_egraph.cost.calibration.OpRate`) price the nodes of an op by a
    measured line instead of the target-wide figures (:meth:`rate`); ``run_ns`` is the fixed cost of one run of
    a whole graph, ``value_ns`` and ``value_ns_per_byte`` that of each graph input and output it is called with
    and returns; ``stream_ns_per_byte`` what a weight byte past ``cache_bytes`` (the last-level cache) costs when
    a model's weights outgrow it, beyond what the lines price; ``shape_ns`` what one node of a run-time shape
    computation costs (:attr:`shape_node_ns`); ``masked_row_ns`` what a row of attention scores costs beyond its
    line when a mask masks keys of it (:func:`~.model.masked_rows`); ``calibration`` says where the figures come from,
    ``sample_nodes`` how many nodes the runtime ran
    for one node of each measured op (the most of its samples).  ``attention_block_max_tokens`` bounds the
    batch*seq of a FusedAttentionBlock (the seed's guard, for targets with no measurement of the block); None:
    no bound, the cost decides at the model's shape.
    """

    name: str
    dispatch_ns: float
    roundtrip_ns: float
    memory_bw: float
    host_readback_bw: float
    unified: bool
    host_thunk_penalty_ns: float
    unified_readback_bw: float = 1.0
    flops_per_ns: float = math.inf
    unsupported: frozenset[str] = field(default_factory=frozenset)
    copied_layouts: frozenset[str] = field(default_factory=frozenset)
    region_kernels: bool = True
    region_max_steps: int = REGION_MAX_STEPS
    region_max_inputs: int = REGION_MAX_INPUTS
    dim_hints: Mapping[str, int] = field(default_factory=dict, hash=False)
    default_dim_hint: int = 16
    rates: Mapping[str, OpRate] = field(default_factory=dict, hash=False)
    run_ns: float = 0.0
    value_ns: float = 0.0
    value_ns_per_byte: float = 0.0
    stream_ns_per_byte: float = 0.0
    cache_bytes: int = 0
    shape_ns: float = 0.0
    masked_row_ns: float = 0.0
    attention_block_max_tokens: int | None = SEED_ATTENTION_BLOCK_MAX_TOKENS
    calibration: str = field(default="", compare=False)
    sample_nodes: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a target needs a name")
        for knob in _NON_NEGATIVE:
            value = getattr(self, knob)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"target {self.name!r}: {knob}={value} must be a finite number >= 0")
        for knob in _POSITIVE:
            value = getattr(self, knob)
            if not value > 0:
                raise ValueError(f"target {self.name!r}: {knob}={value} must be > 0")
        for knob in _COUNTS:
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"target {self.name!r}: {knob}={value!r} must be an integer >= 1")
        object.__setattr__(self, "dim_hints", dict(check_dim_hints(self.dim_hints, f"target {self.name!r}: "
                                                                                  "dim_hints")))
        unsupported = frozenset(self.unsupported)
        unknown = sorted(unsupported - REGISTRY.keys())
        if unknown:
            raise ValueError(f"target {self.name!r}: unsupported names unknown op(s) {unknown}")
        object.__setattr__(self, "unsupported", unsupported)
        copied = frozenset(self.copied_layouts)
        not_layout = sorted(op for op in copied if op not in REGISTRY or REGISTRY[op].kind is not Kind.LAYOUT)
        if not_layout:
            raise ValueError(f"target {self.name!r}: copied_layouts names op(s) that are not layout ops {not_layout}")
        object.__setattr__(self, "copied_layouts", copied)
        bound = self.attention_block_max_tokens
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
            raise ValueError(f"target {self.name!r}: attention_block_max_tokens={bound!r} must be None or an int >= 0")
        kinds = {kind.value for kind in Kind}
        unknown = sorted(key for key in self.rates if key not in kinds and not names_a_line(key))
        if unknown:
            raise ValueError(f"target {self.name!r}: rates name unknown op(s) or kind(s) {unknown}")
        if not all(isinstance(r, OpRate) for r in self.rates.values()):
            raise TypeError(f"target {self.name!r}: rates must map names to OpRate")
        object.__setattr__(self, "rates", dict(self.rates))

    def hint(self, symbol: str) -> int:
        """The size symbolic dim ``symbol`` is priced at."""
        return self.dim_hints.get(symbol, self.default_dim_hint)

    def priced_as(self, price: Callable[[int], int]) -> Target:
        """This target pricing every dim ``d`` of a node's types as ``price(d)`` (how a graph whose symbols
        stand as sentinel values is priced at the hints)."""
        return PricedDims(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Target)}, price=price)

    @property
    def shape_node_ns(self) -> float:
        """What one node of a run-time shape computation costs (a dynamic export's Shape, Slice, Concat and Expand
        nodes on a few int64 elements, which no MIR node's line prices): ``shape_ns`` where measured, else
        ``dispatch_ns``."""
        return self.shape_ns or self.dispatch_ns

    @property
    def readback_bw(self) -> float:
        """Bytes per ns at which graph outputs reach the host."""
        return self.unified_readback_bw if self.unified else self.host_readback_bw

    def supports(self, op: str) -> bool:
        """Whether this target can run op ``op``."""
        return op not in self.unsupported

    def replace(self, **changes: Any) -> Target:
        """A copy with some knobs changed (validated like a new target)."""
        return dataclasses.replace(self, **changes)

    def rate(self, spec: OpSpec, line: str = "") -> OpRate | None:
        """The measured line that prices ``spec``'s nodes: its cost class's (``spec.cost_class``: the op runs as
        that op's kernel; the class's line of the same variant first, ``Conv.depthwise`` for a depthwise FusedConv),
        else the line ``line`` (a node's :func:`~.model.line_key`, ``FusedMatMulBiasAct.gelu``) where there is one,
        else its op's, else its kind's; None: the target-wide figures price them."""
        if not self.rates:
            return None
        variant = line_variant(line)
        return ((variant and self.rates.get(f"{spec.cost_class}.{variant}")) or self.rates.get(spec.cost_class)
                or self.rates.get(line) or self.rates.get(spec.name) or self.rates.get(spec.kind.value))

    def terms(self, launches: float, syncs: float, traffic_bytes: float, readback_bytes: float,
              flops: float, rate: OpRate | None = None, rows: float = 0.0, matrices: float = 0.0) -> dict[str, float]:
        """The predicted-time formula, term by term, in ns (inputs may be negative savings); ``rate``: the
        measured line that prices launches, traffic, FLOPs, rows and matrices (the last three in ``compute``)
        instead of the target-wide figures, which leave rows and matrices out."""
        if rate is None:
            dispatch, traffic, compute = (launches * self.dispatch_ns, traffic_bytes / self.memory_bw,
                                          flops / self.flops_per_ns)
        else:
            dispatch, traffic, compute = (launches * rate.launch_ns, traffic_bytes * rate.ns_per_byte,
                                          flops * rate.ns_per_flop + rows * rate.ns_per_row
                                          + matrices * rate.ns_per_matrix)
        return {
            "dispatch": dispatch,
            "sync": syncs * (self.roundtrip_ns + self.host_thunk_penalty_ns),
            "traffic": traffic,
            "readback": readback_bytes / self.readback_bw,
            "compute": compute,
        }

    def cost_ns(self, cost: NodeCost, spec: OpSpec | None = None, line: str = "") -> float:
        """Predicted ns of one node's counts (a node reads nothing back to the host); ``spec``: the node's op, and
        ``line`` its line key, whose measured line (:meth:`rate`) prices it where the target has one."""
        rate = self.rate(spec, line) if spec is not None else None
        return sum(self.terms(cost.launches, cost.syncs, cost.traffic_bytes, 0, cost.flops, rate, cost.rows,
                              cost.matrices).values())

    def node_ns(self, spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
                out_type: TensorType, reads_intermediate: bool = False) -> float:
        """Predicted ns of one node on this target; inf when the op is unsupported.  A layout op in
        ``copied_layouts`` that reads an intermediate (not only leaves, which a runtime folds at load time)
        is a copy kernel here.

        The e-graph extractor minimises exactly this per e-node, and
        :func:`~rlx_egraph.cost.profile.profile` sums the same node costs.
        """
        if not self.supports(spec.name):
            return math.inf
        cost = node_cost(spec, attrs, in_types, out_type, self.copies(spec, reads_intermediate))
        return self.cost_ns(cost, spec, line_key(spec, attrs, in_types) if cost.launches else "")

    def copies(self, spec: OpSpec, reads_intermediate: bool) -> bool:
        """Whether a node of ``spec`` runs as a copy kernel here: a layout op in ``copied_layouts`` that reads an
        intermediate."""
        return reads_intermediate and spec.name in self.copied_layouts

    def prices_attributes(self, spec: OpSpec, reads_intermediate: bool = False) -> bool:
        """Whether :meth:`node_ns` reads a node's attributes: only for a supported node that launches a kernel
        (through its FLOPs); any other costs 0 or infinity whatever its attributes (extraction's memo of node
        costs leaves them out of its key then)."""
        return self.supports(spec.name) and node_launches(spec, self.copies(spec, reads_intermediate)) > 0

    def should_fuse(self, before: IoProfile, after: IoProfile) -> bool:
        """Whether ``after`` is predicted faster than ``before`` here: the extraction's own rule (the DAG
        cost of :meth:`node_ns`) applied to two whole-graph profiles, priced here; never when ``after`` is
        unsupported."""
        return dataclasses.replace(after, target=self).ns < dataclasses.replace(before, target=self).ns


@dataclass(frozen=True, kw_only=True)
class PricedDims(Target):
    """A target whose node costs read each dim ``d`` as ``price(d)`` (see :meth:`Target.priced_as`)."""

    price: Callable[[int], int] = field(compare=False, hash=False, repr=False)

    def node_ns(self, spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
                out_type: TensorType, reads_intermediate: bool = False) -> float:
        return super().node_ns(spec, attrs, [self._priced(t) for t in in_types], self._priced(out_type),
                               reads_intermediate)

    def _priced(self, t: TensorType | TupleType) -> TensorType | TupleType:
        if isinstance(t, TupleType):
            return TupleType(tuple(self._priced(p) for p in t.parts))
        return TensorType(tuple(self.price(d) for d in t.shape), t.dtype)


def check_dim_hints(hints: Any, what: str) -> Mapping[str, int]:
    """``hints`` if it maps symbol names to ints >= 1; else TypeError or ValueError starting with ``what``."""
    if not isinstance(hints, Mapping):
        raise TypeError(f"{what} must map symbol names to sizes, got {hints!r}")
    for name, size in hints.items():
        if not isinstance(name, str):
            raise TypeError(f"{what}: symbol names are strings, got {name!r}")
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"{what}: the size of {name!r} must be an int, got {size!r}")
        if size < 1:
            raise ValueError(f"{what}: the size of {name!r} must be >= 1, got {size}")
    return hints


def onnxruntime_target(calibration: Calibration) -> Target:
    """The ``onnxruntime`` target priced by ``calibration``: its lines, run cost and target-wide figures."""
    bw = calibration.memory_bw
    sample_nodes: dict[str, int] = {}
    for sample in calibration.samples:
        op = line_op(sample.key)
        sample_nodes[op] = max(sample_nodes.get(op, 0), sample.ran_nodes)
    return Target(name="onnxruntime", dispatch_ns=calibration.dispatch_ns, roundtrip_ns=0.0, memory_bw=bw,
                  host_readback_bw=bw, unified=True, unified_readback_bw=bw, host_thunk_penalty_ns=0.0,
                  flops_per_ns=calibration.flops_per_ns, region_kernels=False, copied_layouts=ORT_LAYOUTS,
                  unsupported=frozenset(name for name, spec in REGISTRY.items()
                                        if spec.kind is Kind.FUSED and name not in ONNXRUNTIME_FUSED),
                  rates=calibration.rates, run_ns=calibration.run_ns, value_ns=calibration.value_ns,
                  value_ns_per_byte=calibration.value_ns_per_byte, calibration=calibration.describe(),
                  stream_ns_per_byte=calibration.stream_ns_per_byte, cache_bytes=calibration.cache_bytes,
                  shape_ns=calibration.shape_ns, masked_row_ns=calibration.masked_row_ns,
                  attention_block_max_tokens=None, sample_nodes=sample_nodes)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(name="cpu", dispatch_ns=3_000.0, roundtrip_ns=0.0, memory_bw=20.0, host_readback_bw=20.0,
               unified=True, unified_readback_bw=20.0, host_thunk_penalty_ns=0.0,
               flops_per_ns=100.0),
        Target(name="cuda", dispatch_ns=5_000.0, roundtrip_ns=20_000.0, memory_bw=1_000.0, host_readback_bw=25.0,
               unified=False, host_thunk_penalty_ns=100_000.0, flops_per_ns=20_000.0),
        Target(name="metal", dispatch_ns=500.0, roundtrip_ns=5_000.0, memory_bw=200.0, host_readback_bw=200.0,
               unified=True, unified_readback_bw=1.0, host_thunk_penalty_ns=2_000_000.0,
               flops_per_ns=math.inf),
        Target(name="wgpu", dispatch_ns=3_000.0, roundtrip_ns=30_000.0, memory_bw=100.0, host_readback_bw=40.0,
               unified=False, host_thunk_penalty_ns=25_000_000.0, flops_per_ns=math.inf,
               unsupported=frozenset({"FusedTransformerLayer", *REGION_KINDS}), region_kernels=False),
        onnxruntime_target(cal.shipped("onnxruntime")),
    )
}


def get_target(target: Target | str) -> Target:
    """A preset by name, or ``target`` itself when it is already a Target.  ``"onnxruntime"`` is priced by this
    machine's cached calibration when there is one (:func:`rlx_egraph.cost.calibration.load`), else by the
    shipped one (``TARGETS["onnxruntime"]``)."""
    if isinstance(target, Target):
        return target
    if target == "onnxruntime":
        return _machine_onnxruntime(cal.cache_path("onnxruntime"))
    try:
        return TARGETS[target]
    except (KeyError, TypeError):
        raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})") from None


_MACHINE: dict[tuple[Path, float], Target] = {}  # cache file and its mtime -> its target


def _machine_onnxruntime(path: Path) -> Target:
    """The onnxruntime target of the calibration cached at ``path`` (remembered per file and mtime), else the
    shipped one."""
    try:
        key = (path, path.stat().st_mtime)
    except OSError:
        return TARGETS["onnxruntime"]
    if key not in _MACHINE:
        _MACHINE[key] = onnxruntime_target(cal.read(path))
    return _MACHINE[key]

"""Calibrations: a target's cost figures measured on one machine, fitted per op, cached per machine.

A :class:`Calibration` holds what a calibration run measured (:class:`Sample`: one node's launches, bytes, FLOPs,
rows and matrices as :func:`~rlx_egraph.cost.model.node_cost` counts them, and its measured ns) and the cost line
fitted to the samples of each op, and per op kind the median of its ops' lines (:class:`OpRate`)::

    ns = launches * launch_ns + traffic_bytes * ns_per_byte + flops * ns_per_flop
       + rows * ns_per_row + matrices * ns_per_matrix

A target prices a node by its op's line, else its kind's, else its own figures
(:meth:`~rlx_egraph.cost.targets.Target.rate`).  A line is fitted by non-negative least squares on the relative
error, so it follows the small and the large samples alike.

Calibrations are JSON files.  :func:`load` returns the one cached for this machine (under :func:`cache_dir`:
the user's cache directory, ``RLX_EGRAPH_CACHE``, or a path given), else the one shipped with the package
(``cost/calibrations/<target>.json``, which names the command and machine class that made it).  The
measuring itself needs the target's runtime and lives with its front end
(``rlx_egraph.frontends.onnx.calibrate`` for ``onnxruntime``); this module only reads, fits and writes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import platformdirs

from ..errors import RlxError
from ..ir.ops.primitives import matmul_flops
from ..ir.registry import REGISTRY

FORMAT_VERSION = 1
CACHE_ENV = "RLX_EGRAPH_CACHE"  # overrides the user cache directory (calibrations are read and written there)
SHIPPED_DIR = Path(__file__).with_name("calibrations")
MIN_WEIGHTED_NS = 100.0
TERMS = ("launch_ns", "ns_per_byte", "ns_per_flop", "ns_per_row", "ns_per_matrix")  # an OpRate's, in field order
COUNTS = ("launches", "traffic_bytes", "flops", "rows", "matrices")  # the Sample count each term multiplies
# The runtime each calibrated target measures; its version is part of the machine fingerprint.
RUNTIMES = {"onnxruntime": "onnxruntime"}


class CalibrationError(RlxError, ValueError):
    """A calibration file that cannot be read: missing, not JSON, another format version, or a bad field."""


@dataclass(frozen=True)
class OpRate:
    """The cost line of one op (or op kind): ns per launch, per byte moved, per FLOP, per row and per matrix
    (:func:`~rlx_egraph.cost.model.node_rows`, :func:`~rlx_egraph.cost.model.node_matrices`), all >= 0."""

    launch_ns: float
    ns_per_byte: float
    ns_per_flop: float
    ns_per_row: float = 0.0
    ns_per_matrix: float = 0.0

    def __post_init__(self) -> None:
        for name in TERMS:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"OpRate.{name}={value!r} must be a finite number >= 0")

    def ns(self, launches: float, traffic_bytes: float, flops: float, rows: float = 0.0,
           matrices: float = 0.0) -> float:
        return (launches * self.launch_ns + traffic_bytes * self.ns_per_byte + flops * self.ns_per_flop
                + rows * self.ns_per_row + matrices * self.ns_per_matrix)

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in TERMS}


@dataclass(frozen=True)
class Sample:
    """One measurement: a node of op (or kind) ``key``, described by ``label``, its counts, its measured ns and the
    onnxruntime ops it ran as."""

    key: str
    label: str
    launches: int
    traffic_bytes: int
    flops: int
    ns: float
    ran: str = ""  # the onnxruntime ops one copy of the node ran as ("MatMul 1, BiasGelu 1"), checked when measured
    rows: int = 0  # cost.model.node_rows
    matrices: int = 0  # cost.model.node_matrices

    @property
    def ran_ops(self) -> dict[str, int]:
        """The onnxruntime ops one copy ran as, with their counts (from ``ran``)."""
        return {op: int(n) for op, _, n in (part.rpartition(" ") for part in self.ran.split(", ") if part)}

    @property
    def ran_nodes(self) -> int:
        """How many nodes one copy ran as (the counts of ``ran`` summed; 0 when it ran as none)."""
        return sum(int(part.rsplit(" ", 1)[1]) for part in self.ran.split(", ") if part)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "launches": self.launches,
                "traffic_bytes": self.traffic_bytes, "flops": self.flops, "ns": self.ns, "ran": self.ran,
                "rows": self.rows, "matrices": self.matrices}

    @property
    def counts(self) -> tuple[int, ...]:
        """The counts :data:`TERMS` multiply, in their order."""
        return tuple(getattr(self, name) for name in COUNTS)


def fit_rate(samples: Iterable[Sample]) -> OpRate:
    """The cost line through ``samples`` (at least one): non-negative least squares on the relative error
    (of samples of at least :data:`MIN_WEIGHTED_NS`: a smaller one, below a clock's noise, weighs no more).
    A term none of the samples has (no FLOPs, say) gets 0."""
    samples = list(samples)
    if not samples:
        raise ValueError("fit_rate needs at least one sample")
    counts = np.array([s.counts for s in samples], dtype=np.float64)
    ns = np.array([s.ns for s in samples], dtype=np.float64)
    weights = 1.0 / np.maximum(ns, MIN_WEIGHTED_NS)
    return OpRate(*(float(c) for c in _nnls(counts * weights[:, None], ns * weights)))


# The terms the lines of one GEMM kernel share (the kernel's rate per byte and per FLOP), and those each has of its
# own: a launch and a term per matrix (a batched MatMul's products); no term per row.  A line whose samples ran a
# kernel besides the GEMM and its Reshapes (:data:`GEMM_KERNELS`; MatMul + BiasGelu: a second kernel over the
# output) has a per-byte term of its own on top of the shared one.  Fitted per line, a Gemm's byte term came out
# seven times a MatMul's from their samples' noise, which priced a decoding step's MatMul + bias Add below the Gemm
# onnxruntime makes of the two.
_GEMM_SHARED = ("ns_per_byte", "ns_per_flop")
_GEMM_OWN = ("launch_ns", "ns_per_matrix", "ns_per_byte")
# onnxruntime's ops that run a GEMM line's data through MLAS's SGEMM and nothing else (a Reshape copies nothing)
GEMM_KERNELS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Reshape"})


def fit_gemm_rates(groups: Mapping[str, Iterable[Sample]]) -> dict[str, OpRate]:
    """The cost lines of ops that compute as one GEMM (``groups``: line key -> its samples), fitted together: one
    rate per byte and per FLOP for all (the runtime's one GEMM kernel: onnxruntime runs MatMul, Gemm and
    MatMul + BiasGelu on MLAS's SGEMM), a launch and a per-matrix term per line, and a per-byte term of its own
    for a line whose samples ran a kernel besides those (:data:`GEMM_KERNELS`, from :attr:`Sample.ran`);
    non-negative least squares on the relative error, as :func:`fit_rate`.  Fitted one by one, two lines of the
    same kernel differ in their rates by their samples' noise, which at a real model's size outweighs what a fusion
    saves."""
    groups = {key: list(samples) for key, samples in groups.items()}
    keys = sorted(groups)
    rows = [(k, s) for k, key in enumerate(keys) for s in groups[key]]
    if not rows:
        return {}
    own, shared = len(_GEMM_OWN), len(_GEMM_SHARED)
    second_kernel = [any(set(s.ran_ops) - GEMM_KERNELS for s in groups[key]) for key in keys]
    design = np.zeros((len(rows), own * len(keys) + shared))
    target = np.zeros(len(rows))
    for r, (k, s) in enumerate(rows):
        weight = 1.0 / max(s.ns, MIN_WEIGHTED_NS)
        for j, term in enumerate(_GEMM_OWN):
            if term != "ns_per_byte" or second_kernel[k]:
                design[r, own * k + j] = getattr(s, COUNTS[TERMS.index(term)]) * weight
        for j, term in enumerate(_GEMM_SHARED):
            design[r, own * len(keys) + j] = getattr(s, COUNTS[TERMS.index(term)]) * weight
        target[r] = s.ns * weight
    coef = _nnls(design, target)
    common = {term: float(coef[own * len(keys) + j]) for j, term in enumerate(_GEMM_SHARED)}
    lines = {}
    for k, key in enumerate(keys):
        terms = dict(common)
        for j, term in enumerate(_GEMM_OWN):
            terms[term] = terms.get(term, 0.0) + float(coef[own * k + j])
        lines[key] = OpRate(**terms)
    return lines


def _line_of(key: str) -> str:
    """The line a sample of ``key`` is fitted into: its op's cost class where that names another op (of the same
    variant: a depthwise FusedConv's samples into ``Conv.depthwise``), else ``key``."""
    op, _, variant = key.partition(".")
    spec = REGISTRY.get(op)
    if spec is None or spec.cost_class not in REGISTRY:
        return key
    return f"{spec.cost_class}.{variant}" if variant else spec.cost_class


def computes_as_gemm(key: str) -> bool:
    """Whether the line ``key`` prices an op whose FLOPs are one GEMM's (:func:`~rlx_egraph.ir.ops.primitives.
    matmul_flops`: MatMul, MatMulBT, the FusedMatMul*Add ops, FusedMatMulBiasAct)."""
    spec = REGISTRY.get(key.partition(".")[0])
    return spec is not None and spec.flops is matmul_flops


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 (Lawson and Hanson's active set), on columns scaled to like size.  A column
    that is all zero (a count none of the rows has) gets 0, and so does one that is a multiple of an earlier column
    (an elementwise op's FLOPs grow with its bytes: such an op is priced by its bytes)."""
    scale = np.abs(a).max(axis=0)
    used = scale > 0
    x = np.zeros(a.shape[1])
    if not used.any():
        return x
    for j in np.flatnonzero(used):
        if any(np.allclose(a[:, j] / scale[j], a[:, i] / scale[i], rtol=1e-9, atol=1e-12)
               for i in np.flatnonzero(used[:j])):
            used[j] = False
    m = a[:, used] / scale[used]
    n = m.shape[1]
    passive = np.zeros(n, bool)
    z = np.zeros(n)
    tol = 1e-10 * max(1.0, float(np.abs(m).max()) * float(np.abs(b).max()))
    for _ in range(3 * n + 10):
        gradient = m.T @ (b - m @ z)
        free = ~passive & (gradient > tol)
        if not free.any():
            break
        passive[int(np.argmax(np.where(free, gradient, -np.inf)))] = True
        while True:
            trial = np.zeros(n)
            if passive.any():
                trial[passive] = np.linalg.lstsq(m[:, passive], b, rcond=None)[0]
            if (trial[passive] > 0).all():
                z = trial
                break
            # step from z toward trial until the first passive term reaches 0, which leaves the set
            falling = passive & (trial <= 0)
            step = np.min(z[falling] / np.maximum(z[falling] - trial[falling], 1e-300))
            z = z + step * (trial - z)
            passive &= z > tol
            z[~passive] = 0.0
    x[used] = z / scale[used]
    return x


@dataclass(frozen=True)
class Calibration:
    """A target's figures measured on one machine.

    ``run_ns`` is the fixed cost of one model run (the runtime's call, its inputs and outputs); ``dispatch_ns``,
    ``memory_bw`` (B/ns) and ``flops_per_ns`` price the ops no line covers; ``rates`` maps an op name or a kind
    (:class:`~rlx_egraph.ir.registry.Kind` value) to its fitted line; ``samples`` are the measurements they
    were fitted to.  ``value_ns`` and ``value_ns_per_byte`` price each graph input and output of a run (the value
    crosses the runtime's call).  ``stream_ns_per_byte`` is what a weight byte read from memory costs beyond what
    the lines price (their samples' weights in cache), paid for the weights past ``cache_bytes`` (the machine's
    last-level cache) of a model whose weights outgrow it.  ``shape_ns`` is what one node of a run-time shape
    computation costs (a dynamic export's Shape, Slice, Concat and Expand nodes on a few int64 elements; 0 in files
    made before it was measured: ``dispatch_ns`` prices them).  ``masked_row_ns`` is what a row of attention scores
    costs beyond its line when a mask masks keys of it (the lines' samples feed open masks; 0 in files made before
    it was measured: such rows are priced as open ones).  ``machine`` is the fingerprint of the machine and
    runtime (:func:`machine`), ``threads`` the runtime's thread count, ``command`` the command that made it.
    """

    target: str
    machine: Mapping[str, str]
    command: str
    threads: int
    run_ns: float
    dispatch_ns: float
    memory_bw: float
    flops_per_ns: float
    rates: Mapping[str, OpRate] = field(default_factory=dict)
    samples: tuple[Sample, ...] = ()
    source: str = field(default="", compare=False)  # where it was read from (set by load/read)
    value_ns: float = 0.0  # one graph input or output of a run (0 in files made before it was measured)
    value_ns_per_byte: float = 0.0
    stream_ns_per_byte: float = 0.0  # 0 in files made before weights streamed from memory were measured
    cache_bytes: int = 0
    shape_ns: float = 0.0
    masked_row_ns: float = 0.0

    @classmethod
    def fitted(cls, target: str, samples: Iterable[Sample], *, machine: Mapping[str, str], command: str,
               threads: int, run_ns: float, dispatch_ns: float, memory_bw: float,
               flops_per_ns: float, value_ns: float = 0.0, value_ns_per_byte: float = 0.0,
               stream_ns_per_byte: float = 0.0, cache_bytes: int = 0, shape_ns: float = 0.0,
               masked_row_ns: float = 0.0) -> Calibration:
        """A calibration whose rates are fitted to ``samples``: one line per key (the lines of ops that compute as
        one GEMM sharing their FLOP rate: :func:`fit_gemm_rates`; the samples of an op whose cost class is another
        op's, as FusedConv's is Conv's, fitted into that op's line, which prices both), for an op measured per
        variant only (``Op.value`` keys) one through all its samples (for the variants none measured), and one per
        op kind, each term the median of its measured ops' (for the ops of that kind no sample measured)."""
        samples = tuple(samples)
        by_key: dict[str, list[Sample]] = {}
        for s in samples:
            by_key.setdefault(_line_of(s.key), []).append(s)
        rates = {key: fit_rate(group) for key, group in by_key.items() if not computes_as_gemm(key)}
        rates |= fit_gemm_rates({key: group for key, group in by_key.items() if computes_as_gemm(key)})
        by_op: dict[str, list[Sample]] = {}  # an op measured per variant only: its variants' samples pooled
        for key, group in by_key.items():
            if key.partition(".")[2]:
                by_op.setdefault(key.partition(".")[0], []).extend(group)
        for op, group in by_op.items():
            rates.setdefault(op, fit_rate(group))  # prices the variants no sample measured
        by_kind: dict[str, list[OpRate]] = {}
        for key, rate in rates.items():
            if key.partition(".")[0] in REGISTRY:  # an op's line, or one of its variants' (cost.model.line_key)
                by_kind.setdefault(REGISTRY[key.partition(".")[0]].kind.value, []).append(rate)
        for kind, lines in by_kind.items():
            rates.setdefault(kind, OpRate(*(float(np.median([getattr(r, term) for r in lines])) for term in TERMS)))
        return cls(target, dict(machine), command, threads, run_ns, dispatch_ns, memory_bw, flops_per_ns, rates,
                   samples, value_ns=value_ns, value_ns_per_byte=value_ns_per_byte,
                   stream_ns_per_byte=stream_ns_per_byte, cache_bytes=cache_bytes, shape_ns=shape_ns,
                   masked_row_ns=masked_row_ns)

    def predicted_ns(self, sample: Sample) -> float:
        """``sample`` priced by its key's line."""
        return self.rates[sample.key].ns(*sample.counts)

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "target": self.target, "machine": dict(self.machine),
                "command": self.command, "threads": self.threads, "run_ns": self.run_ns,
                "dispatch_ns": self.dispatch_ns, "memory_bw": self.memory_bw, "flops_per_ns": self.flops_per_ns,
                "value_ns": self.value_ns, "value_ns_per_byte": self.value_ns_per_byte,
                "stream_ns_per_byte": self.stream_ns_per_byte, "cache_bytes": self.cache_bytes,
                "shape_ns": self.shape_ns, "masked_row_ns": self.masked_row_ns,
                "rates": {k: r.to_dict() for k, r in sorted(self.rates.items())},
                "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> Calibration:
        where = source or "calibration"
        if not isinstance(data, Mapping) or data.get("format_version") != FORMAT_VERSION:
            version = data.get("format_version") if isinstance(data, Mapping) else None
            raise CalibrationError(f"{where}: format_version {version!r} is not {FORMAT_VERSION}; run "
                                   "rlx-egraph calibrate again")
        try:
            return cls(str(data["target"]), {str(k): str(v) for k, v in data["machine"].items()},
                       str(data["command"]), int(data["threads"]), float(data["run_ns"]),
                       float(data["dispatch_ns"]), float(data["memory_bw"]), float(data["flops_per_ns"]),
                       {str(k): OpRate(**v) for k, v in data["rates"].items()},
                       tuple(Sample(**s) for s in data["samples"]), source, float(data.get("value_ns", 0.0)),
                       float(data.get("value_ns_per_byte", 0.0)), float(data.get("stream_ns_per_byte", 0.0)),
                       int(data.get("cache_bytes", 0)), float(data.get("shape_ns", 0.0)),
                       float(data.get("masked_row_ns", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CalibrationError(f"{where}: not a calibration ({type(exc).__name__}: {exc})") from None

    def save(self, path: str | Path) -> Path:
        """Write this calibration as JSON to ``path`` (its folder is created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    def describe(self) -> str:
        """One line: whose figures these are."""
        where = self.source or "in memory"
        return f"{self.target} calibration of {self.machine.get('cpu', '?')} ({where}; made by: {self.command})"


def read(path: str | Path) -> Calibration:
    """The calibration in JSON file ``path``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CalibrationError(f"{path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not JSON ({exc})") from None
    return Calibration.from_dict(data, str(path))


def machine(target: str) -> dict[str, str]:
    """This machine's fingerprint for ``target``: host, system, processor, cores and the runtime's version.  A
    cached calibration is found by it, so it is used only on the machine and runtime that made it."""
    return dict(_fingerprint(target))


@functools.cache
def _fingerprint(target: str) -> tuple[tuple[str, str], ...]:
    runtime = RUNTIMES.get(target, target)
    try:
        version = metadata.version(runtime)
    except metadata.PackageNotFoundError:
        version = "not installed"
    return (("host", platform.node()), ("system", f"{platform.system()} {platform.machine()}"),
            ("cpu", _cpu_name()), ("cores", str(os.cpu_count())), ("runtime", f"{runtime} {version}"))


def _cpu_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cache_dir(cache: str | Path | None = None) -> Path:
    """Where calibrations are cached: ``cache`` if given, else ``$RLX_EGRAPH_CACHE``, else the user's cache
    directory for rlx-egraph (``~/.cache/rlx-egraph`` on Linux)."""
    if cache is not None:
        return Path(cache)
    return Path(os.environ.get(CACHE_ENV) or _user_cache_dir())


@functools.cache
def _user_cache_dir() -> str:
    return platformdirs.user_cache_dir("rlx-egraph")


def cache_path(target: str, cache: str | Path | None = None) -> Path:
    """The cache file of ``target``'s calibration on this machine (under :func:`cache_dir`)."""
    return cache_dir(cache) / "calibration" / f"{target}-{_machine_key(target)}.json"


@functools.cache
def _machine_key(target: str) -> str:
    return hashlib.sha256(json.dumps(machine(target), sort_keys=True).encode()).hexdigest()[:16]


def shipped(target: str) -> Calibration:
    """The calibration shipped with the package for ``target``."""
    path = SHIPPED_DIR / f"{target}.json"
    if not path.is_file():
        raise CalibrationError(f"no shipped calibration for target {target!r}")
    calibration = read(path)
    return Calibration(**{**calibration.__dict__, "source": "shipped with rlx-egraph"})


def load(target: str, cache: str | Path | None = None) -> Calibration:
    """This machine's cached calibration of ``target`` (the latest ``rlx-egraph calibrate`` made), else the
    shipped one."""
    path = cache_path(target, cache)
    return read(path) if path.is_file() else shipped(target)


__all__ = ["CACHE_ENV", "COUNTS", "TERMS", "Calibration", "CalibrationError", "OpRate", "Sample", "cache_dir",
           "cache_path", "computes_as_gemm", "fit_gemm_rates", "fit_rate", "load", "machine", "read", "shipped"]

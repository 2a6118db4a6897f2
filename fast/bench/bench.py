"""bench.py: both tiers of wmma_mm and their peers, side by side in one run, and
what a build costs.

From fast/:
    python -m bench.bench                 # tables A to D below (needs a GPU)
    python -m bench.bench --forward       # table A alone
    python -m bench.bench --forward --picture a.svg   # table A drawn at a.svg
    python -m bench.bench --step          # tables B and C alone
    python -m bench.bench --day88         # table D alone
    python -m bench.bench --build-times   # cold build and warm import, in fresh processes

The table flags combine (--forward --day88). Each table holds, shape by shape, one
line per implementation of the same computation:
- lesson: the lesson's operator, op.wmma_mm (day87::wmma_mm, op.py's FP32 backward);
- fast: day 88's, day87_fast.wmma_mm (day87_fast, its tensor-core backward);
- cuBLAS: what PyTorch does without either: torch.mm(a, b, out_dtype=torch.float32)
  for a forward at the operators' precision (FP16 in, FP32 accumulate, FP32 out),
  and plain FP16 x @ w, the path autocast takes, for a training step and a backward;
- compiled: the cuBLAS line's function under torch.compile(mode=
  "max-autotune-no-cudagraphs"), compiled once per shape (dynamic=False) and whole
  (fullgraph=True, so that a graph break cannot leave it running eagerly), its
  compiling and autotuning done before it is timed. That mode is max-autotune's
  autotuning without its CUDA graphs: with them, the compiled function would replay
  a graph of its own inside the one that measures GPU time, and its wall and host
  times would be a replay's, not a call's; so every line is timed the same way. For
  the forward it stays at FP32 accuracy or says otherwise: where this torch cannot
  compile torch.mm's out_dtype, the line names the form compiled instead, and its
  error shows it;
- Triton: bench/triton_peer.py, a Triton GEMM with the tiles its autotuner picks
  among a few, FP16 in, FP32 accumulation and output, in tables A and D (there with
  the bias added in its epilogue): what a day 88 user would write next. Its first
  call at each shape autotunes, before the line is timed. Where triton does not
  import (torch's CPU-only wheels have none), tables A and D say so and have no
  Triton line.

Each line has three times, microseconds per call (bench/timing.py measures them):
wall, calls back to back and then one synchronize, divided by their count; host,
the Python call alone with the GPU idle before it; GPU, the calls captured in one
CUDA graph and replayed, the host taken out. Why three: the host queues the next
call while the GPU runs this one, so a loop costs the slower of the two (wall),
and a kernel that wins on the GPU can still lose the loop to its host code. Then
the GPU time over the cuBLAS line's, and the output's error against float64,
computed in the same run, so that a line is seen to be as accurate as the rest:
for an FP32 output, its worst error as a fraction of the lesson's bound,
test_op.py's error_ratio (K * 2^-23 * (|A| @ |B|), and (K + 1) * 2^-23 *
(|A| @ |B| + |bias|) with a bias; 1 is the bound's edge, and a line past it, or
NaN, says FAIL); for an FP16 output (FP16 addmm's, and every line's gradients in
tables B and C), which that bound does not cover, the word FP16 and the relative
error ||out - float64|| / ||float64||, not graded.

A. The forward, c = a @ b, at the lesson's shapes and at 2048^3, 4096^3,
   8192 x 4096 x 4096 and 8192^3: the fast tier as it chooses, and then with each
   of its kernels forced (DAY87_FAST_KERNEL=wmma, and =persistent where the card runs
   the Hopper kernel); GPU times taken in turn, as in table D. At every shape, a line under
   the block gives cuBLAS's GPU time over the fast tier's as it chooses, in both
   orders, against its target (TARGETS): met only where its margin (over 1, or over
   a target below 1) is larger than the replays' spread (print_target). The table
   is also drawn, GPU TF/s by shape with the card's dense FP16 peak
   (bench/forward_picture.py), as an SVG at --picture's path (bench-forward.svg in
   the current folder unless given).
B. One layer's training step, x (M x K) @ w (K x N) forward and backward,
   torch.autograd.grad(forward(x, w), (x, w), grad): the operators with an FP32
   grad, as their FP32 output has, the FP16 paths with an FP16 one; GPU times taken
   in turn, as in table D. At
   the two sizes of STEP_TARGETS a line gives FP16's GPU time over the fast tier's
   against its target, weighed as table A's.
C. The backward alone at the same shapes: the lesson's op.py _backward (two FP32
   matmuls of the widened operands), the fast tier's wmma_mm_backward operator, FP16
   grad @ w.t() and x.t() @ grad, and those two compiled; GPU times taken in turn.
D. Day 88's question, a bias in the kernel's store or added after: the fast tier's
   fused wmma_mm_bias against each operator plus a bias add, cuBLAS plus a bias
   add, that compiled, FP16 addmm and Triton's fused kernel; the lines' GPU times
   taken in turn, in the listed order and in reverse (timing.graphs_in_turn), each
   GPU time and ratio printed for both directions, and the spread of each line's
   replays in either direction ((slowest - fastest) / median): a lead smaller than it
   is not a lead.
   At every shape, lines give cuBLAS + bias's, compiled's and Triton's GPU times over
   the fused op's against their targets (DAY88_TARGETS), weighed as table A's.
After each table, the seconds that torch.compile spent compiling and autotuning
for it: what its line costs before its first useful call (less on a second run,
which finds inductor's caches on disk); then the table again as Markdown, one row
per figure and one column per implementation, which fast/NOTES.md pastes.

bench/figures_hold.py compares the fast tier's GPU times with an earlier commit's.
"""

import argparse
import contextlib
import dataclasses
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import NamedTuple

import torch

from tests import lesson_folder  # the lesson's op.py importable

if __name__ == "__main__":
    # Usage, and the answer on a machine without a GPU, before the imports below build
    # the extensions.
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forward", action="store_true", help="table A")
    parser.add_argument("--step", action="store_true", help="tables B and C")
    parser.add_argument("--day88", action="store_true", help="table D")
    parser.add_argument("--build-times", action="store_true",
                        help="the builds' and imports' seconds alone")
    parser.add_argument("--picture", default="bench-forward.svg", metavar="PATH",
                        help="where table A's picture is written (default: %(default)s)")
    ARGUMENTS = parser.parse_args()
    if ARGUMENTS.build_times and (ARGUMENTS.forward or ARGUMENTS.step or ARGUMENTS.day88):
        parser.error("--build-times runs alone")
    if not ARGUMENTS.build_times and not torch.cuda.is_available():
        print("bench.py needs a GPU; nothing to measure here.")
        sys.exit(0)

import torch._dynamo  # noqa: E402
import torch._inductor.config  # noqa: E402

import day87_fast  # noqa: E402  the fast tier, installed
import op  # noqa: E402  the lesson
from day87_fast import lesson_copy  # noqa: E402  the lesson's backward formula, copied
from bench import forward_picture, timing  # noqa: E402

try:
    from bench import triton_peer  # noqa: E402  the Triton lines' kernel
    TRITON_MISSING = None
except ImportError as error:  # triton ships with torch's CUDA wheels only
    triton_peer, TRITON_MISSING = None, f"{type(error).__name__}: {error}"

COMPILE_MODE = "max-autotune-no-cudagraphs"
DAY88_SIZES = [(256, 384, 512), (512, 128, 1024), (2048, 2048, 2048), (8192, 4096, 4096)]  # M, K, N
LABEL_WIDTH = 52


# ---------------------------------------------------------------------------
# The FP16 computations that the cuBLAS and compiled lines run. Functions, not
# lambdas made per shape, so that each compiled line is the same code at every shape.
# ---------------------------------------------------------------------------
def mm_fp32_out(a, b):
    return torch.mm(a, b, out_dtype=torch.float32)


def mm_fp16_widened(a, b):
    return (a @ b).float()


def fp32_product(a, b):
    """The compiled line's fallback where torch.mm's out_dtype does not compile: the
    operands widened to FP32 first, FP32 products rather than FP16 ones."""
    return a.float() @ b.float()


def fp16_forward(x, w):
    return x @ w


def fp16_products(grad, x, w):
    """The FP16 backward of x @ w: grad_x and grad_w, two cuBLAS products."""
    return grad @ w.t(), x.t() @ grad


class Baseline(NamedTuple):
    """cuBLAS at wmma_mm's precision contract, as this torch offers it."""
    function: object  # (a, b) -> a @ b
    label: str  # what the tables call it
    graded: bool  # its output is FP32, and so graded against the lesson's bound


def baseline():
    probe = torch.ones(16, 16, dtype=torch.half, device="cuda")
    try:
        mm_fp32_out(probe, probe)
        return Baseline(mm_fp32_out, "torch.mm(a, b, out_dtype=torch.float32)", True)
    except TypeError:  # out_dtype arrived around torch 2.8
        return Baseline(mm_fp16_widened, "(a @ b).float(), no out_dtype here", False)


def training_step(forward, x, w, grad):
    """One layer's step as a call: forward, then both gradients."""
    return lambda: torch.autograd.grad(forward(x, w), (x, w), grad)


# ---------------------------------------------------------------------------
# Errors against float64, on the GPU: test_op.py's error_ratio computes its
# reference on the CPU, minutes at 4096^3.
# ---------------------------------------------------------------------------
def float64_product(a, b, bias=None):
    """(reference, magnitude): a @ b (+ bias) and |a| @ |b| (+ |bias|) in float64,
    what error_ratio's bound is made of."""
    a64, b64 = a.double(), b.double()
    reference, magnitude = a64 @ b64, a64.abs() @ b64.abs()
    if bias is not None:
        reference, magnitude = reference + bias.double(), magnitude + bias.double().abs()
    return reference, magnitude


def relative_error(result, reference):
    return ((result.double() - reference).norm() / reference.norm()).item()


def forward_error(graded, reference, magnitude, terms):
    """A function of an output that says its error: graded, the worst error over the
    lesson's bound for an FP32 result, terms * 2^-23 * magnitude (terms: K, or K + 1
    with a bias); else FP16, with the relative error."""
    bound = terms * 2.0**-23 * magnitude + torch.finfo(torch.float64).tiny

    def error(output):
        if not graded:
            return f"FP16, not graded; rel. {relative_error(output, reference):.1e}"
        ratio = ((output.double() - reference).abs() / bound).max().item()
        return f"{ratio:.3f} of bound" + (
            "" if ratio <= 1 else ": FAIL, outside the bound")  # NaN fails too
    return error


def gradient_error(grad, x, w):
    """A function of (grad_x, grad_w) that says their error against float64 from the
    same grad, x and w: the relative error, the worse of the two. Gradients are FP16
    in every line (the contract gives them their input's dtype), so none is graded
    against the FP32 bound."""
    grad64, x64, w64 = grad.double(), x.detach().double(), w.detach().double()
    references = (grad64 @ w64.t(), x64.t() @ grad64)

    def error(gradients):
        dtypes = {str(gradient.dtype).replace("torch.", "") for gradient in gradients}
        worst = max(relative_error(gradient, reference)
                    for gradient, reference in zip(gradients, references))
        return (f"{'FP16' if dtypes == {'float16'} else '/'.join(sorted(dtypes))} grads, "
                f"not graded; rel. {worst:.1e}")
    return error


# ---------------------------------------------------------------------------
# A table: per shape, a block with one line per implementation.
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Line:
    # lesson, fast, cuBLAS, compiled or fp16; the first "cuBLAS" line is the GPU ratio's base
    kind: str
    label: str  # what is called
    call: object  # the call timed, its operands bound
    error: object  # the call's output -> what its error against float64 is
    kernel: str = None  # DAY87_FAST_KERNEL while the line is checked and timed, where set
    backward: str = None  # DAY87_FAST_BACKWARD, the same way


# What the fast tier as it chooses should reach (M, N, K): cuBLAS's GPU time over its
# own, in both orders: within 1.15x cuBLAS's time at the lesson's shapes (the target
# version 5 was written for), and version 4's at the large ones; neither version met
# it, and both left the package (fast/NOTES.md, "Performance", has the figures).
TARGETS = {(256, 512, 384): 1 / 1.15, (512, 1024, 128): 1 / 1.15, (2048, 2048, 2048): 1.00,
           (4096, 4096, 4096): 1.03, (8192, 4096, 4096): 1.03, (8192, 8192, 8192): 1.03}
# And day 88's fused op, at (M, K, N): each peer's GPU time over its own, the peer
# named by its line's kind in table D (cuBLAS: cuBLAS + bias; Triton: its fused kernel,
# where triton imports): 3% ahead of each at every shape, and 10% ahead of compiled at
# 8192 x 4096 x 4096 (version 4's target too).
DAY88_TARGETS = {shape: {"cuBLAS": 1.03, "compiled": 1.03, "Triton": 1.03}
                 for shape in DAY88_SIZES}
DAY88_TARGETS[8192, 4096, 4096]["compiled"] = 1.10
# And the step (M, K, N), table B: FP16's GPU time over the fast tier's, as it chooses,
# in both orders: at most 1.30x FP16's time at a small layer and at a middle one.
STEP_TARGETS = {(256, 384, 512): 1 / 1.30, (2048, 512, 2048): 1 / 1.30}


def print_target(what, timings, spreads, line, peer, target):
    """The peer line's GPU time over `line`'s, in order and reversed, against the
    target. Met only where it holds in both orders and the ratio clears 1 (a lead over
    the peer), or a target below 1, by more than either line's spread in that order (a
    lead smaller than the spread is not a lead); otherwise missed, or met within the
    spread (not shown)."""
    ratios = [theirs.gpu / ours.gpu for ours, theirs in zip(timings[line], timings[peer])]
    widest = [max(spread) for spread in zip(spreads[line], spreads[peer])]
    floor = min(1.0, target)
    verdict = ("MISSED" if min(ratios) < target
               else "met, but within the replays' spread: not shown"
               if any(ratio - floor <= spread for ratio, spread in zip(ratios, widest))
               else "met")
    print(f"  {what}: {ratios[0]:.3f} in order, {ratios[1]:.3f} reversed (spreads "
          f"{100 * widest[0]:.1f}%, {100 * widest[1]:.1f}%); target at least {target:.3f}: "
          f"{verdict}\n", flush=True)


@contextlib.contextmanager
def switched(variable, value):
    """The environment variable (DAY87_FAST_KERNEL, DAY87_FAST_BACKWARD) set to `value`
    (None: left as it is) inside, put back after. The operator reads both at every
    call, so a line's calls and its CUDA graph's capture all run what the line names,
    and no call pays for setting them."""
    saved = os.environ.get(variable)
    if value is not None:
        os.environ[variable] = value
    try:
        yield
    finally:
        os.environ.pop(variable, None)
        if saved is not None:
            os.environ[variable] = saved


@contextlib.contextmanager
def line_switches(line):
    """A line's DAY87_FAST_KERNEL and DAY87_FAST_BACKWARD, while it is checked and timed."""
    with switched("DAY87_FAST_KERNEL", line.kernel), \
            switched("DAY87_FAST_BACKWARD", line.backward):
        yield


def runs_forced(kernel):
    """Whether this card runs the forward forced to `kernel`: forced, the operator refuses
    where the card cannot."""
    a = torch.zeros(128, 128, device="cuda", dtype=torch.half)
    with switched("DAY87_FAST_KERNEL", kernel):
        try:
            day87_fast.wmma_mm(a, a)
            return True
        except RuntimeError:
            return False


def print_block(shape, lines, calls, both_orders=False):
    """Check each line's output against float64, time it, and print the block. With
    both_orders, the lines' GPU times are taken in turn (timing.graphs_in_turn), in
    order and in reverse, and each GPU column is printed for either direction: a
    lead that holds in both is not the order's."""
    errors, timings, spreads = {}, {}, {}
    for index, line in enumerate(lines):
        with line_switches(line):
            errors[index] = line.error(line.call())
            timings[index] = [timing.Figures(timing.wall_microseconds(line.call, calls),
                                             timing.host_alone(line.call), None)
                              if both_orders else timing.measure(line.call, calls)]
    if both_orders:
        # Each line's graph is captured under its own switches (a graph keeps the
        # kernels it captured), then the graphs are replayed in turn.
        def under_its_switches(line):
            def call():
                with line_switches(line):
                    return line.call()
            return call
        in_order, reversed_order = timing.graphs_in_turn(
            [under_its_switches(line) for line in lines], calls)
        for index in timings:
            timings[index] = [timings[index][0]._replace(gpu=in_order[index].median),
                              timings[index][0]._replace(gpu=reversed_order[index].median)]
            spreads[index] = (in_order[index].spread, reversed_order[index].spread)
    cublas = next(index for index, line in enumerate(lines) if line.kind == "cuBLAS")
    bases = [figures.gpu for figures in timings[cublas]]
    gpu_heads = ["GPU us", "reversed"][:len(timings[cublas])]
    ratio_heads = ["GPU/cuBLAS", "reversed"][:len(timings[cublas])]
    print(f"{shape} ({calls} calls)".ljust(11 + LABEL_WIDTH) + f"{'wall us':>10}{'host us':>10}"
          + "".join(f"{head:>10}" for head in gpu_heads)
          + "".join(f"{head:>12}" for head in ratio_heads)
          + (f"{'spread %':>12}" if both_orders else "") + "  error vs float64")
    for index, line in enumerate(lines):
        first = timings[index][0]
        print(f"  {line.kind:<9}{line.label:<{LABEL_WIDTH}}{first.wall:>10.1f}{first.host:>10.1f}"
              + "".join(f"{figures.gpu:>10.2f}" for figures in timings[index])
              + "".join(f"{figures.gpu / base:>12.2f}"
                        for figures, base in zip(timings[index], bases))
              + (f"{'/'.join(f'{100 * s:.1f}' for s in spreads[index]):>12}"
                 if both_orders else "")
              + f"  {errors[index]}")
    print(flush=True)
    markdown.add(shape, lines, [timings[index] for index in range(len(lines))],
                 [errors[index] for index in range(len(lines))])
    return timings, spreads, cublas


class Compiler:
    """torch.compile for one table's compiled lines, and the seconds their first
    calls took (tracing, code generation, autotuning). Made at a table's start: it
    drops what the previous table compiled. Each function is compiled once per
    shape (dynamic=False), at most four shapes a table, each an entry in dynamo's
    cache of that function's code; the limit is raised far above that, since a
    function past it would run eagerly under the compiled line's name."""

    def __init__(self):
        torch._dynamo.reset()
        torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
        self.seconds = 0.0

    def first_call(self, function, run):
        """`function` compiled; run(compiled), its first call, is timed."""
        compiled = torch.compile(function, mode=COMPILE_MODE, dynamic=False, fullgraph=True)
        start = time.perf_counter()
        try:
            run(compiled)
            torch.cuda.synchronize()
        finally:  # a compile that fails has cost its seconds too
            self.seconds += time.perf_counter() - start
        return compiled

    def forward(self, function, label, graded, fallback, fallback_label, arguments):
        """(compiled function, its line's label, whether graded): `function` where it
        compiles whole, else `fallback` (FP32 products), said on a line of its own and
        in the label."""
        try:
            return self.first_call(function, lambda compiled: compiled(*arguments)), label, graded
        except Exception as error:  # dynamo's and inductor's own exception types vary by release
            message = str(error).strip()
            reason = f"{type(error).__name__}: {message.splitlines()[0] if message else ''}"[:150]
            print(f"   compiled: {label} does not compile whole here; "
                  f"compiling {fallback_label} instead;\n"
                  f"     {reason}")
            return (self.first_call(fallback, lambda compiled: compiled(*arguments)),
                    f"fallback {fallback_label}", True)

    def report(self):
        print("   torch.compile's first calls (compiling, autotuning) for this table: "
              f"{self.seconds:.0f} s\n", flush=True)


class MarkdownTable:
    """A table's figures again, as Markdown that fast/NOTES.md pastes: one row per
    figure (a shape and one of its times, or its error), one column per
    implementation (a line's kind, with the switches it forces, or its label where a
    block has two lines of one kind)."""

    def __init__(self, title):
        self.title, self.columns, self.rows = title, [], {}

    def add(self, shape, lines, timings, errors):
        names = [column_name(line) for line in lines]
        names = [f"{name}: {line.label.strip()}" if names.count(name) > 1 else name
                 for name, line in zip(names, lines)]
        for index, name in enumerate(names):
            if name not in self.columns:
                self.columns.append(name)
            figures = timings[index]
            cells = {"GPU us": f"{figures[0].gpu:.2f}", "wall us": f"{figures[0].wall:.1f}",
                     "host us": f"{figures[0].host:.1f}", "error vs float64": errors[index]}
            if len(figures) > 1:
                cells["GPU us, reversed"] = f"{figures[1].gpu:.2f}"
            for figure, cell in cells.items():
                self.rows.setdefault(f"{shape}, {figure}", {})[name] = cell

    def print(self):
        print(f"{self.title}, as Markdown ({device_line()})\n")
        print("| figure | " + " | ".join(self.columns) + " |")
        print("| --- |" + " --- |" * len(self.columns))
        for row, cells in self.rows.items():
            print(f"| {row} | " + " | ".join(cells.get(name, "") for name in self.columns) + " |")
        print(flush=True)


def column_name(line):
    """A line's implementation: its kind, and what it forces (DAY87_FAST_KERNEL and
    DAY87_FAST_BACKWARD) where it forces anything."""
    forced = [switch for switch in (line.kernel, line.backward) if switch not in (None, "auto")]
    return line.kind + (f" ({', '.join(forced)})" if forced else "")


# The table being printed: table_heading starts it, print_block adds each block to it,
# and each table prints it last.
markdown = None


def table_heading(title, *more):
    global markdown
    markdown = MarkdownTable("Table " + title.split(".")[0])
    print(title)
    print("   wall: calls back to back, then synchronize, / calls; host: one call alone, "
          "GPU idle before it (median of 50);")
    print("   GPU: the calls captured in one CUDA graph, replayed (median of 7), / calls; "
          "where a block has a 'reversed' column, the lines' graphs replayed in turn, "
          "in order and in reverse, each timed replay right after an untimed one of its own;")
    print(f"   compiled: torch.compile(mode={COMPILE_MODE!r}, dynamic=False, fullgraph=True), "
          "once per shape;")
    for line in more:
        print(f"   {line}")
    print()


def triton_missing():
    """A heading's line saying why its table has no Triton line, where it has none."""
    if triton_peer is not None:
        return []
    return [f"Triton: no line, bench/triton_peer.py does not import here: {TRITON_MISSING}"]


def print_triton_tiles():
    """The tiles Triton's autotuner chose for the block just printed (its last call's)."""
    if triton_peer is not None:
        print(f"  Triton's tiles here: {triton_peer.gemm_kernel.best_config}\n", flush=True)


# The versions that DAY87_FAST_KERNEL forces, for the picture's legend.
VERSIONS = {"wmma": 1, "persistent": 3}


def forward_table(base, picture):
    function, label, graded = base
    table_heading("A. the forward, c = a @ b, a (M x K) and b (K x N) FP16, c FP32",
                  "error: the worst |c - float64| / (K * 2^-23 * (|A| @ |B|)), test_op.py's bound; "
                  "FP16: rel. ||c - float64|| / ||float64||", *triton_missing())
    compiler = Compiler()
    # The fast tier as it chooses, and each of its kernels forced (version 3 where this
    # card runs it).
    forced = ["wmma"] + (["persistent"] if runs_forced("persistent") else [])
    # The picture's bars: every line but compiled's, in TF/s from the mean of its GPU
    # times in both orders.
    names = (["lesson", "fast, as it chooses"]
             + [f"fast, {kernel} (version {VERSIONS[kernel]})" for kernel in forced] + ["cuBLAS"]
             + (["Triton"] if triton_peer else []))
    tflops = {name: [] for name in names}
    for m, n, k in timing.FORWARD_SHAPES:
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        b = torch.randn(k, n, device="cuda", dtype=torch.half)
        reference, magnitude = float64_product(a, b)
        peer, peer_label, peer_graded = compiler.forward(function, label, graded, fp32_product,
                                                         "a.float() @ b.float()", (a, b))
        lines = [
            Line("lesson", "op.wmma_mm(a, b)", lambda: op.wmma_mm(a, b),
                 forward_error(True, reference, magnitude, k)),
            Line("fast", "day87_fast.wmma_mm(a, b)", lambda: day87_fast.wmma_mm(a, b),
                 forward_error(True, reference, magnitude, k), "auto"),
            *[Line("fast", f"  DAY87_FAST_KERNEL={kernel}", lambda: day87_fast.wmma_mm(a, b),
                   forward_error(True, reference, magnitude, k), kernel) for kernel in forced],
            Line("cuBLAS", label, lambda: function(a, b),
                 forward_error(graded, reference, magnitude, k)),
            Line("compiled", peer_label, lambda: peer(a, b),
                 forward_error(peer_graded, reference, magnitude, k)),
            *([Line("Triton", "triton_peer.matmul(a, b)", lambda: triton_peer.matmul(a, b),
                    forward_error(True, reference, magnitude, k))] if triton_peer else []),
        ]
        timings, spreads, cublas = print_block(f"M={m} N={n} K={k}", lines,
                                               timing.calls_for(m, n, k), both_orders=True)
        print_triton_tiles()
        if (m, n, k) in TARGETS:  # line 1 is the fast tier as it chooses
            print_target("cuBLAS GPU time / the fast tier's as it chooses", timings, spreads,
                         1, cublas, TARGETS[m, n, k])
        bars = [index for index, line in enumerate(lines) if line.kind != "compiled"]
        for name, index in zip(names, bars):
            mean_us = statistics.mean(figures.gpu for figures in timings[index])
            tflops[name].append(2 * m * n * k / mean_us / 1e6)
    compiler.report()
    markdown.print()
    device = torch.cuda.get_device_name()
    with open(picture, "w") as file:
        file.write(forward_picture.forward_svg(
            f"c = a @ b, FP16 in, FP32 out: GPU TF/s on {device}, torch {torch.__version__}",
            ["x".join(map(str, shape)) for shape in timing.FORWARD_SHAPES],
            list(tflops.items()), forward_picture.dense_fp16_peak(device)))
    print(f"   table A drawn: {os.path.abspath(picture)} (shapes M x N x K)\n", flush=True)


def step_table():
    table_heading("B. one layer's training step, x (M x K) @ w (K x N) FP16, "
                  "torch.autograd.grad(forward(x, w), (x, w), grad)",
                  "lesson and fast: an FP32 grad (their output is FP32); cuBLAS and compiled: "
                  "x @ w in FP16, an FP16 grad;",
                  "error: the gradients' against float64 from the same grad, x and w")
    compiler = Compiler()
    for m, k, n in timing.STEP_SIZES:
        x, w, grad = timing.layer_operands(m, k, n, requires_grad=True)
        grad16 = grad.half()
        peer = compiler.first_call(
            fp16_forward, lambda compiled: training_step(compiled, x, w, grad16)())
        error, error16 = gradient_error(grad, x, w), gradient_error(grad16, x, w)
        fast_step = training_step(day87_fast.wmma_mm, x, w, grad)
        timings, spreads, cublas = print_block(f"M={m} K={k} N={n}", [
            Line("lesson", "op.wmma_mm, op.py's FP32 backward",
                 training_step(op.wmma_mm, x, w, grad), error),
            # "auto" for both switches: a line as it chooses whatever the shell exported.
            Line("fast", "day87_fast.wmma_mm, its tensor-core backward", fast_step, error,
                 kernel="auto", backward="auto"),
            Line("cuBLAS", "x @ w, FP16", training_step(fp16_forward, x, w, grad16), error16),
            Line("compiled", "x @ w, FP16", training_step(peer, x, w, grad16), error16),
        ], timing.calls_for(m, n, k), both_orders=True)
        if (m, k, n) in STEP_TARGETS:  # line 1 is the fast tier as it chooses
            print_target("FP16's GPU time / the fast tier's as it chooses", timings, spreads,
                         1, cublas, STEP_TARGETS[m, k, n])
    compiler.report()
    markdown.print()


def backward_table():
    table_heading("C. the backward alone: grad_x = grad @ w^T and grad_w = x^T @ grad, "
                  "x (M x K) and w (K x N) FP16",
                  "lesson and fast: an FP32 grad; cuBLAS and compiled: FP16; "
                  "error: as in table B")
    compiler = Compiler()
    for m, k, n in timing.STEP_SIZES:
        x, w, grad = timing.layer_operands(m, k, n)
        grad16 = grad.half()
        # What the lesson's backward formula reads of autograd's ctx: both inputs saved,
        # both gradients wanted.
        context = types.SimpleNamespace(saved_tensors=(x, w), needs_input_grad=(True, True))
        peer = compiler.first_call(fp16_products, lambda compiled: compiled(grad16, x, w))
        error, error16 = gradient_error(grad, x, w), gradient_error(grad16, x, w)
        print_block(f"M={m} K={k} N={n}", [
            Line("lesson", "the lesson's formula (ctx, grad): two FP32 matmuls",
                 lambda: lesson_copy.backward_formula(context, grad), error),
            Line("fast", "torch.ops.day87_fast.wmma_mm_backward(grad, x, w)",
                 lambda: torch.ops.day87_fast.wmma_mm_backward(grad, x, w), error,
                 backward="auto"),
            Line("cuBLAS", "grad @ w.t(), x.t() @ grad, FP16",
                 lambda: fp16_products(grad16, x, w), error16),
            Line("compiled", "grad @ w.t(), x.t() @ grad, FP16",
                 lambda: peer(grad16, x, w), error16),
        ], timing.calls_for(m, n, k), both_orders=True)
    compiler.report()
    markdown.print()


def day88_table(base):
    function, label, graded = base

    def cublas_bias(a, b, bias):
        return function(a, b) + bias

    def fp32_product_bias(a, b, bias):
        return fp32_product(a, b) + bias

    table_heading("D. day 88: the bias in the kernel's store or added after; "
                  "a (M x K), b (K x N) FP16, bias (N) FP32",
                  "error: the worst |c - float64| / ((K + 1) * 2^-23 * (|A| @ |B| + |bias|)), "
                  "test_op.py's bound; FP16: rel., bias FP16 too", *triton_missing())
    compiler = Compiler()
    for m, k, n in DAY88_SIZES:
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        b = torch.randn(k, n, device="cuda", dtype=torch.half)
        bias = torch.randn(n, device="cuda")
        bias16 = bias.half()
        reference, magnitude = float64_product(a, b, bias)
        peer, peer_label, peer_graded = compiler.forward(
            cublas_bias, f"{label} + bias", graded, fp32_product_bias,
            "a.float() @ b.float() + bias", (a, b, bias))
        error = forward_error(True, reference, magnitude, k + 1)
        lines = [
            Line("fast", "day87_fast.wmma_mm_bias(a, b, bias): fused",
                 lambda: day87_fast.wmma_mm_bias(a, b, bias), error),
            Line("lesson", "op.wmma_mm(a, b) + bias", lambda: op.wmma_mm(a, b) + bias, error),
            Line("fast", "day87_fast.wmma_mm(a, b) + bias", lambda: day87_fast.wmma_mm(a, b) + bias,
                 error),
            Line("cuBLAS", f"{label} + bias", lambda: cublas_bias(a, b, bias),
                 forward_error(graded, reference, magnitude, k + 1)),
            Line("compiled", peer_label, lambda: peer(a, b, bias),
                 forward_error(peer_graded, reference, magnitude, k + 1)),
            Line("fp16", "torch.addmm(bias16, a, b)", lambda: torch.addmm(bias16, a, b),
                 forward_error(False, reference, magnitude, k + 1)),
            *([Line("Triton", "triton_peer.matmul_bias(a, b, bias): fused",
                    lambda: triton_peer.matmul_bias(a, b, bias), error)] if triton_peer else []),
        ]
        timings, spreads, _ = print_block(f"M={m} K={k} N={n}", lines, timing.calls_for(m, n, k),
                                          both_orders=True)
        print_triton_tiles()
        for kind, target in DAY88_TARGETS[m, k, n].items():  # line 0 is the fused op
            peer_line = next((index for index, line in enumerate(lines) if line.kind == kind),
                             None)
            if peer_line is None:  # Triton's, where triton does not import
                continue
            print_target(f"{kind} GPU time / the fused op's", timings, spreads, 0, peer_line,
                         target)
    compiler.report()
    markdown.print()


def device_line():
    now = datetime.datetime.now(datetime.timezone.utc)
    return (f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, {now:%Y-%m-%d %H:%M:%S} UTC")


def build_times():
    """Cold build, in a fresh cache: the lesson's extension, built at its first import;
    and warm import (median of 5 fresh processes) of torch, then the lesson's op, then
    day87_fast, which is built ahead of time (its wheel's build time is CI's, in its log).
    The probes find op through PYTHONPATH, as a user's script would, and day87_fast where
    it is installed."""
    cold_probe = ("import time; import torch; t0 = time.perf_counter(); import op; "
                  "print(time.perf_counter() - t0)")
    warm_probe = ("import time; t0 = time.perf_counter(); import torch; "
                  "t1 = time.perf_counter(); import op; "
                  "t2 = time.perf_counter(); import day87_fast; t3 = time.perf_counter(); "
                  "print(t1 - t0, t2 - t1, t3 - t2)")

    def seconds(probe, environment):
        return [float(part) for part in subprocess.run(
            [sys.executable, "-c", probe], env=environment, check=True,
            capture_output=True, text=True).stdout.split()]

    with tempfile.TemporaryDirectory(prefix="day87-cold-") as cache:
        environment = dict(os.environ, TORCH_EXTENSIONS_DIR=cache,
                           PYTHONPATH=lesson_folder.LESSON)
        lesson_cold, = seconds(cold_probe, environment)
        warm = [seconds(warm_probe, environment) for _ in range(5)]
    torch_import, op_import, fast_import = (statistics.median(sample[i] for sample in warm)
                                            for i in range(3))
    what = f"architectures {op.BUILD['archs']}" if op.BUILD["with_cuda"] else "the CPU part only"
    print(f"cold build: the lesson's extension ({what}) {lesson_cold:.1f} s; day87_fast is "
          f"built ahead of time (architectures {day87_fast.BUILD['archs']})")
    print(f"warm import: import torch {torch_import:.3f} s, import op {op_import:.3f} s, "
          f"then import day87_fast {fast_import:.3f} s ({day87_fast.__file__})")


def main(arguments):
    if arguments.build_times:
        return build_times()
    if not (op.BUILD["with_cuda"] and day87_fast.BUILD["with_cuda"]):
        print("bench.py needs the extensions' CUDA parts, and they were built without; "
              "nothing to measure here.")
        return
    # Inductor reports each autotuning on stderr, a dozen lines a product, which
    # would bury the tables; the environment variable, where set, still rules.
    if ("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED" not in os.environ
            and hasattr(torch._inductor.config, "autotune_num_choices_displayed")):
        torch._inductor.config.autotune_num_choices_displayed = 0
    print(device_line() + "\n", flush=True)
    every = not (arguments.forward or arguments.step or arguments.day88)
    base = baseline()
    if every or arguments.forward:
        forward_table(base, arguments.picture)
    if every or arguments.step:
        step_table()
        backward_table()
    if every or arguments.day88:
        day88_table(base)


if __name__ == "__main__":
    main(ARGUMENTS)

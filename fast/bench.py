"""bench.py: the fast tier's wmma_mm beside cuBLAS, a training step beside fp16, and
what a build costs.

    python fast/bench.py                 # every table below (needs a GPU)
    python fast/bench.py --forward       # tables 1 to 3 alone
    python fast/bench.py --step          # tables 4 and 4a alone
    python fast/bench.py --backward      # table 4a alone
    python fast/bench.py --day88         # table 6 alone
    python fast/bench.py --build-times   # cold build and warm import, in fresh processes

"Ours" is day87_fast (fast_op.py): the tuned forward and the tensor-core backward.
The tables, in order:
1. The forward's GPU time with host overhead taken out: calls captured in one CUDA
   graph and replayed, operands in L2, beside cuBLAS at the same precision contract
   (FP16 in, FP32 accumulate, FP32 out: torch.mm with out_dtype=torch.float32).
2. The forward's throughput at large shapes: fresh random inputs, never zeros,
   rotated through sets that are together twice the L2, so every call reads its
   operands from memory; medians of 15 CUDA-event timings of back-to-back calls.
3. Host overhead: wall time per call at 128^3, where the GPU finishes first.
4. One layer's training step, x (M x K) @ w (K x N) forward and backward, side by
   side: the op; the fp16 path that autocast takes; the op's forward with the
   lesson's FP32 backward (op.py's); the floor, the same registration with a
   backward that launches nothing. For each: wall time per step (steps back to
   back), host time per step (the Python call alone, GPU idle before it) and GPU
   time per step (the step captured in a CUDA graph and replayed), and the kernels
   the backward launches. Then (4a) the backward alone, its kernels' GPU time beside
   the fp16 path's, split into cuBLAS's two products and fast/kernel.cu's scaling
   kernel; and (4b) where the op's host time goes: each call of a step timed alone.
5. The same steps under torch.compile(mode="reduce-overhead"), operands marked
   static (no input copies), timed after the warm-up steps that record the graphs.
6. Day 88's question: the fused wmma_mm_bias against wmma_mm + bias, cuBLAS + bias
   and fp16 addmm, GPU time as in table 1.
7. The backward's accuracy against float64.
"""

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

FAST = os.path.dirname(os.path.abspath(__file__))
LESSON = os.path.dirname(FAST)
sys.path[:0] = [FAST, LESSON]  # fast_op.py, and the lesson's op.py that it imports

import torch  # noqa: E402

if __name__ == "__main__":
    # Usage, and the answer on a machine without a GPU, before the imports below build
    # the extensions.
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    only = parser.add_mutually_exclusive_group()
    for flag in ("--forward", "--step", "--backward", "--day88", "--build-times"):
        only.add_argument(flag, action="store_true")
    ARGUMENTS = parser.parse_args()
    if not ARGUMENTS.build_times and not torch.cuda.is_available():
        print("bench.py needs a GPU; nothing to measure here.")
        sys.exit(0)

import fast_op  # noqa: E402  ours
import op  # noqa: E402  the lesson: its backward, for a comparison operator (table 4)

GRAPH_SIZES = [(256, 512, 384), (512, 1024, 128), (1024, 1024, 1024), (2048, 2048, 512),
               (2048, 2048, 2048)]
SIZES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 1024)]
STEP_SIZES = [(256, 384, 512), (2048, 512, 2048), (4096, 1024, 4096), (8192, 4096, 4096)]  # M, K, N
TIMINGS = 15


def baseline():
    """cuBLAS at wmma_mm's precision contract, and what to call it in the table."""
    probe = torch.ones(16, 16, dtype=torch.half, device="cuda")
    try:
        torch.mm(probe, probe, out_dtype=torch.float32)
        return (lambda a, b: torch.mm(a, b, out_dtype=torch.float32)), "torch.mm(out_dtype=f32)"
    except TypeError:  # out_dtype arrived around torch 2.8
        return (lambda a, b: (a @ b).float()), "(a @ b).float(): FP16 out, no out_dtype here"


def input_sets(m, n, k, requires_grad=False):
    """Enough (a, b) pairs that together they are twice the L2, at most 64 of them."""
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    per_set = 2 * (m * k + k * n)
    count = min(64, max(1, math.ceil(2 * l2_bytes / per_set)))
    return [(torch.randn(m, k, device="cuda", dtype=torch.half, requires_grad=requires_grad),
             torch.randn(k, n, device="cuda", dtype=torch.half, requires_grad=requires_grad))
            for _ in range(count)]


def milliseconds_per_call(function, sets, target_ms=20.0):
    for a, b in sets:  # warm-up: module load, cuBLAS heuristics, the caching allocator
        function(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for a, b in sets:
        function(a, b)
    end.record()
    end.synchronize()
    calls = max(len(sets), int(target_ms / max(start.elapsed_time(end) / len(sets), 1e-3)))
    timings = []
    for _ in range(TIMINGS):
        start.record()
        for call in range(calls):
            function(*sets[call % len(sets)])
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end) / calls)
    return statistics.median(timings)


def graph_microseconds(function, calls=200, replays=7):
    """GPU time per call with no host in the way: `calls` calls captured in one CUDA
    graph (warmed up on a side stream first, as capture requires), the graph
    replayed, the median replay divided by `calls`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            function()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            function()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timings = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        timings.append(1e3 * start.elapsed_time(end) / calls)
    del graph
    return statistics.median(timings)


def host_microseconds_per_call(function, a, b, calls=2000):
    """Wall time per call at a size where the GPU finishes first: the host's cost."""
    for _ in range(50):
        function(a, b)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        function(a, b)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * elapsed / calls


def forward_tables(base, base_name):
    print("1. forward GPU time, CUDA-graph replays (200 calls a graph, operands in L2), microseconds")
    print(f"{'M':>6}{'N':>6}{'K':>6}{'wmma_mm':>10}{base_name:>26}{'ratio':>7}")
    for m, n, k in GRAPH_SIZES:
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        b = torch.randn(k, n, device="cuda", dtype=torch.half)
        ours = graph_microseconds(lambda: fast_op.wmma_mm(a, b))
        theirs = graph_microseconds(lambda: base(a, b))
        print(f"{m:>6}{n:>6}{k:>6}{ours:>10.2f}{theirs:>26.2f}{ours / theirs:>7.2f}", flush=True)
    print()
    print("2. forward throughput, operands rotated past the L2, CUDA events")
    print(f"{'M':>6}{'N':>6}{'K':>6}{'wmma_mm TFLOP/s':>17}{'cuBLAS TFLOP/s':>16}{'ratio':>7}"
          f"{'wmma_mm us':>12}{'cuBLAS us':>11}")
    for m, n, k in SIZES:
        sets = input_sets(m, n, k)
        ours = milliseconds_per_call(fast_op.wmma_mm, sets)
        theirs = milliseconds_per_call(base, sets)
        flops = 2.0 * m * n * k
        print(f"{m:>6}{n:>6}{k:>6}{flops / ours / 1e9:>17.1f}{flops / theirs / 1e9:>16.1f}"
              f"{theirs / ours:>7.2f}{1e3 * ours:>12.1f}{1e3 * theirs:>11.1f}", flush=True)
        del sets
    print()
    print("3. host overhead at 128^3, microseconds of wall time per call")
    print(f"{'inputs':<22}{'wmma_mm':>10}{base_name:>28}")
    for requires_grad in (False, True):
        (a, b), = input_sets(128, 128, 128, requires_grad)[:1]
        ours = host_microseconds_per_call(fast_op.wmma_mm, a, b)
        theirs = host_microseconds_per_call(base, a, b)
        label = "requires_grad=True" if requires_grad else "plain tensors"
        print(f"{label:<22}{ours:>10.1f}{theirs:>28.1f}")
    print()


# ---------------------------------------------------------------------------
# The training step
# ---------------------------------------------------------------------------
def comparison_operators():
    """The op's forward (day87_fast::wmma_mm) under the same kind of registration as
    the op (a fake, register_autograd), twice. 'floor' has a backward that launches
    nothing: it returns zeros made before timing, so the distance from the op's step
    to this one is what its backward costs. 'lesson' has the lesson's backward,
    op.py's own: two FP32 matmuls."""
    library = torch.library.Library("day87_bench", "DEF")
    zeros = {}

    def kernel(a, b):
        with torch.no_grad():  # opaque to autograd, as a C++ kernel is
            return torch.ops.day87_fast.wmma_mm(a, b)

    def floor_setup(ctx, inputs, output):
        ctx.shapes = [tuple(t.shape) for t in inputs]

    def floor_backward(ctx, grad):
        return tuple(zeros[shape] for shape in ctx.shapes)

    for name, setup, backward in (("floor", floor_setup, floor_backward),
                                  ("lesson", op._setup_context, op._backward)):
        library.define(f"{name}(Tensor a, Tensor b) -> Tensor")
        library.impl(name, kernel, "CUDA")
        torch.library.register_fake(f"day87_bench::{name}", fast_op._fake, lib=library)
        torch.library.register_autograd(f"day87_bench::{name}", backward, setup_context=setup, lib=library)

    def prepare(*tensors):
        for t in tensors:
            zeros.setdefault(tuple(t.shape), torch.zeros_like(t))

    return library, prepare


def step_variants():
    """name: (forward, the dtype of the output gradient)."""
    return {"op": (fast_op.wmma_mm, torch.float32), "fp16 x @ w": (torch.mm, torch.half),
            "lesson FP32 bwd": (torch.ops.day87_bench.lesson, torch.float32),
            "floor": (torch.ops.day87_bench.floor, torch.float32)}


def backward_on_the_gpu(forward, x, w, grad):
    """The kernels (and memsets, copies) one eager backward puts on the GPU: profiler events."""
    from torch.profiler import ProfilerActivity, profile
    out = forward(x, w)
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            torch.autograd.grad(out, (x, w), grad)
            torch.cuda.synchronize()
    return [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def backward_kernels(forward, x, w, grad):
    """How many kernels (and memsets, copies) one eager backward puts on the GPU."""
    return len(backward_on_the_gpu(forward, x, w, grad))


def own_kernels():
    """The kernels that fast/kernel.cu defines, by qualified name ("tuned::splitSumKernel"):
    any other kernel in a backward is a library's (cuBLAS's products). Qualified, so
    that the lesson's kernel of the same bare name, which fast/kernel.cu includes, is
    not taken for one of them."""
    with open(os.path.join(FAST, "kernel.cu")) as source:
        text = source.read()
    namespace = re.search(r"^namespace (\w+) \{", text, re.MULTILINE).group(1)
    names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text)
    return {f"{namespace}::{name}" for name in names}


def backward_kernel_microseconds(forward, x, w, grad, repeats=7):
    """{part: GPU microseconds} of one eager backward's kernels (profiler), median of
    `repeats` backwards; the parts are "products" (the library's kernels) and each of
    fast/kernel.cu's kernels by name."""
    own, samples = own_kernels(), []
    for _ in range(repeats + 1):  # the first is a warm-up
        parts = {"products": 0.0}
        for event in backward_on_the_gpu(forward, x, w, grad):
            kernel = re.match(r"(?:void )?([\w:]+)", event.name).group(1)  # up to its template or parameters
            part = kernel if kernel in own else "products"
            parts[part] = parts.get(part, 0.0) + (getattr(event, "device_time", None) or event.cuda_time)
        samples.append(parts)
    return {part: statistics.median(sample.get(part, 0.0) for sample in samples[1:]) for part in samples[-1]}


def backward_table():
    print("4a. the backward alone: its kernels' GPU time (profiler, median of 7 backwards), microseconds;")
    print("    the fp16 path is x @ w with an fp16 grad, in the same run; products: cuBLAS's kernels")
    for m, k, n in STEP_SIZES[1:]:
        x = torch.randn(m, k, device="cuda", dtype=torch.half, requires_grad=True)
        w = torch.randn(k, n, device="cuda", dtype=torch.half, requires_grad=True)
        grad = torch.randn(m, n, device="cuda")
        ours = backward_kernel_microseconds(fast_op.wmma_mm, x, w, grad)
        theirs = sum(backward_kernel_microseconds(torch.mm, x, w, grad.half()).values())
        total = sum(ours.values())
        print(f"{f'{m}x{k}x{n}':<18} op {total:.1f}, fp16 {theirs:.1f}, ratio {total / theirs:.2f}; "
              + ", ".join(f"{part} {time:.1f}" for part, time in ours.items()), flush=True)
    print()


def host_alone(call, repeats=50):
    """Median host microseconds of one call, the GPU idle before each."""
    call()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append(1e6 * (time.perf_counter() - start))
    torch.cuda.synchronize()
    return statistics.median(times)


def time_step(step, steps):
    """(wall, host) microseconds per step: steps back to back, and the call alone."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = 1e6 * (time.perf_counter() - start) / steps
    return wall, host_alone(step)


def training_step_tables(prepare_floor):
    variants = step_variants()
    print("4. one layer, forward + backward (torch.autograd.grad of x @ w), eager, microseconds per step")
    print("   wall: steps back to back; host: the Python call alone; GPU: the step replayed as a CUDA graph;")
    print("   kernels: what one backward launches (profiler)")
    header = f"{'M x K x N':<18}" + "".join(f"{name:>30}" for name in variants) + f"{'op / fp16 (wall, GPU)':>24}"
    print(header)
    print(f"{'':<18}" + f"{'wall  host   GPU  kernels':>30}" * len(variants))
    compiled_rows = []
    for m, k, n in STEP_SIZES:
        x = torch.randn(m, k, device="cuda", dtype=torch.half, requires_grad=True)
        w = torch.randn(k, n, device="cuda", dtype=torch.half, requires_grad=True)
        prepare_floor(x, w)
        grads = {torch.float32: torch.randn(m, n, device="cuda")}
        grads[torch.half] = grads[torch.float32].half()
        steps = 200 if m * n * k < 2**33 else 50
        cells, figures = [], {}
        for name, (forward, grad_dtype) in variants.items():
            grad = grads[grad_dtype]

            def step(forward=forward, grad=grad):
                return torch.autograd.grad(forward(x, w), (x, w), grad)
            wall, host = time_step(step, steps)
            gpu = graph_microseconds(step, calls=10 if steps == 200 else 2, replays=5)
            kernels = backward_kernels(forward, x, w, grad)
            figures[name] = (wall, gpu)
            cells.append(f"{wall:>8.0f}{host:>6.0f}{gpu:>6.0f}{kernels:>9}")
        ratio = f"{figures['op'][0] / figures['fp16 x @ w'][0]:.2f}, {figures['op'][1] / figures['fp16 x @ w'][1]:.2f}"
        print(f"{f'{m}x{k}x{n}':<18}" + "".join(f"{cell:>30}" for cell in cells) + f"{ratio:>24}", flush=True)
        compiled_rows.append((m, k, n, x, w, grads))
    print()
    return variants, compiled_rows


def host_breakdown():
    print("4b. where the op's step spends host time: each piece called alone, GPU idle before it, us")
    pieces = ["forward", "forward, grad kept", "wmma_mm_backward", "cast, mm fp16", "mm f32 (lesson)",
              "autograd.grad of the op"]
    print(f"{'M x K x N':<18}" + "".join(f"{name:>24}" for name in pieces))
    for m, k, n in STEP_SIZES:
        x = torch.randn(m, k, device="cuda", dtype=torch.half, requires_grad=True)
        w = torch.randn(k, n, device="cuda", dtype=torch.half, requires_grad=True)
        grad = torch.randn(m, n, device="cuda")
        x16, w16, w32 = x.detach(), w.detach(), w.detach().float()
        out = fast_op.wmma_mm(x, w)
        figures = [host_alone(lambda: fast_op.wmma_mm(x16, w16)), host_alone(lambda: fast_op.wmma_mm(x, w)),
                   host_alone(lambda: torch.ops.day87_fast.wmma_mm_backward(grad, x16, w16)),
                   host_alone(lambda: torch.mm(grad.half(), w16.t())),
                   host_alone(lambda: torch.mm(grad, w32.t())),
                   host_alone(lambda: torch.autograd.grad(out, (x, w), grad, retain_graph=True))]
        print(f"{f'{m}x{k}x{n}':<18}" + "".join(f"{figure:>24.1f}" for figure in figures), flush=True)
    print()


def compiled_step_table(variants, rows):
    print('5. the same steps under torch.compile(mode="reduce-overhead"), microseconds per step')
    print("   operands marked static (no input copies); timed after 3 warm-up steps record the graphs;")
    print("   wall and host as in table 4")
    names = [name for name in variants if name != "floor"]
    print(f"{'M x K x N':<18}" + "".join(f"{name:>22}" for name in names) + f"{'op / fp16 (wall)':>18}")
    for m, k, n, x, w, grads in rows:
        torch._dynamo.mark_static_address(x)
        torch._dynamo.mark_static_address(w)
        cells, walls = [], {}
        for name in names:
            forward, grad_dtype = variants[name]
            grad = grads[grad_dtype]
            torch._dynamo.reset()
            compiled = torch.compile(lambda x, w, forward=forward: forward(x, w), mode="reduce-overhead")

            def step(compiled=compiled, grad=grad):
                torch.compiler.cudagraph_mark_step_begin()
                return torch.autograd.grad(compiled(x, w), (x, w), grad)
            wall, host = time_step(step, 200 if m * n * k < 2**33 else 50)
            walls[name] = wall
            cells.append(f"{wall:>14.0f}{host:>8.0f}")
        print(f"{f'{m}x{k}x{n}':<18}" + "".join(f"{cell:>22}" for cell in cells)
              + f"{walls['op'] / walls['fp16 x @ w']:>18.2f}", flush=True)
    from torch._dynamo.utils import counters
    skips = {key: value for key, value in counters["inductor"].items() if "cudagraph" in key}
    print(f"   inductor's cudagraph counters: {skips or 'none'}; recompiles: {dict(counters['recompiles']) or 'none'}")
    torch._dynamo.reset()
    print()


def day88_table(base):
    """Day 88's question: the fused wmma_mm_bias, the bias added in the kernel's store,
    against the three ways to get the same output without it."""
    print("6. day 88: bias in the epilogue or not, GPU time per call (CUDA-graph replays, operands in L2), us")
    columns = ["fused wmma_mm_bias", "wmma_mm + bias", "cuBLAS f32 + bias", "addmm fp16"]
    print(f"{'M x K x N':<18}" + "".join(f"{name:>20}" for name in columns))
    for m, k, n in [(256, 384, 512), (512, 128, 1024), (2048, 2048, 2048), (8192, 4096, 4096)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        b = torch.randn(k, n, device="cuda", dtype=torch.half)
        bias = torch.randn(n, device="cuda")
        bias16 = bias.half()
        calls = 200 if m * n * k < 2**33 else 20
        figures = [graph_microseconds(function, calls=calls) for function in (
            lambda: fast_op.wmma_mm_bias(a, b, bias), lambda: fast_op.wmma_mm(a, b) + bias,
            lambda: base(a, b) + bias, lambda: torch.addmm(bias16, a, b))]
        print(f"{f'{m}x{k}x{n}':<18}" + "".join(f"{figure:>20.2f}" for figure in figures), flush=True)
    print()


def accuracy_table():
    m, k, n = 2048, 1024, 1536
    print(f"7. backward accuracy at {m}x{k}x{n}: ||grad_a - float64|| / ||float64||")
    print(f"{'gradients':<14}{'wmma_mm':>10}{'fp16 path':>11}{'lesson FP32':>13}")
    for regime in ("randn", "1e-7..1e-5"):
        x = torch.randn(m, k, device="cuda").half().requires_grad_()
        w = torch.randn(k, n, device="cuda").half().requires_grad_()
        grad = torch.randn(m, n, device="cuda")
        if regime != "randn":
            grad = grad.sign() * 10 ** torch.empty_like(grad).uniform_(-7, -5)
        reference = grad.double() @ w.double().t()
        errors = [torch.autograd.grad(fast_op.wmma_mm(x, w), x, grad)[0], torch.autograd.grad(x @ w, x, grad.half())[0]]
        errors.append(torch.autograd.grad(torch.ops.day87_bench.lesson(x, w), x, grad)[0])
        errors = [((e.double() - reference).norm() / reference.norm()).item() for e in errors]
        print(f"{regime:<14}{errors[0]:>10.2e}{errors[1]:>11.2e}{errors[2]:>13.2e}")


def device_line(base_name=None):
    return (f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
            + (f", baseline {base_name}" if base_name else "") + "\n")


def bench():
    base, base_name = baseline()
    print(device_line(base_name))
    forward_tables(base, base_name)
    library, prepare_floor = comparison_operators()  # noqa: F841, kept alive for the tables below
    variants, rows = training_step_tables(prepare_floor)
    backward_table()
    host_breakdown()
    compiled_step_table(variants, rows)
    day88_table(base)
    accuracy_table()


def build_times():
    """Cold build, in a fresh cache: the lesson's extension (which fast_op.py imports
    first), then the fast tier's alone; and warm import (median of 5 fresh processes)
    of torch, then the lesson's op, then fast_op."""
    path = f"import sys; sys.path[:0] = [{LESSON!r}, {FAST!r}]; import time; "
    cold_probe = path + ("import torch; t0 = time.perf_counter(); import op; t1 = time.perf_counter(); "
                         "import fast_op; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)")
    warm_probe = path + ("t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import op; "
                         "t2 = time.perf_counter(); import fast_op; t3 = time.perf_counter(); "
                         "print(t1 - t0, t2 - t1, t3 - t2)")

    def seconds(probe, environment):
        return [float(part) for part in subprocess.run([sys.executable, "-c", probe], env=environment, check=True,
                                                       capture_output=True, text=True).stdout.split()]

    with tempfile.TemporaryDirectory(prefix="day87-cold-") as cache:
        environment = dict(os.environ, TORCH_EXTENSIONS_DIR=cache)
        lesson_cold, fast_cold = seconds(cold_probe, environment)
        warm = [seconds(warm_probe, environment) for _ in range(5)]
    torch_import, op_import, fast_import = (statistics.median(sample[i] for sample in warm) for i in range(3))
    what = f"architectures {fast_op.BUILD['archs']}" if fast_op.BUILD["with_cuda"] else "CPU part only"
    print(f"cold build ({what}): the lesson's extension {lesson_cold:.1f} s, then the fast tier's {fast_cold:.1f} s")
    print(f"warm import: import torch {torch_import:.3f} s, import op {op_import:.3f} s, "
          f"then import fast_op {fast_import:.3f} s")


def main(arguments):
    if arguments.build_times:
        return build_times()
    if not fast_op.BUILD["with_cuda"]:
        print("bench.py needs the extension's CUDA part, and it was built without one; nothing to measure here.")
        return
    if arguments.forward:
        base, base_name = baseline()
        print(device_line(base_name))
        forward_tables(base, base_name)
    elif arguments.step:
        print(device_line())
        library, prepare_floor = comparison_operators()  # noqa: F841, kept alive for the tables
        training_step_tables(prepare_floor)
        backward_table()
    elif arguments.backward:
        print(device_line())
        backward_table()
    elif arguments.day88:
        print(device_line())
        day88_table(baseline()[0])
    else:
        bench()


if __name__ == "__main__":
    main(ARGUMENTS)

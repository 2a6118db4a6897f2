"""timing.py: how bench.py and figures_hold.py time a call, written once,
and the shapes and seeded operands that both of them time.

    from bench import timing   (from fast/)
    figures = timing.measure(lambda: day87_fast.wmma_mm(a, b), timing.calls_for(m, n, k))
    figures.wall, figures.host, figures.gpu      # microseconds per call

A call costs the host (Python, the dispatcher, the launches) and the GPU (the
kernels), and the two overlap: the host queues the next call while the GPU runs
this one. So each call gets three figures, each in microseconds per call:

- wall (wall_microseconds): calls back to back, then one synchronize, the elapsed
  time divided by their count. What a loop of them costs: the slower of the host
  and the GPU, once the queue is full.
- host (host_alone): the Python call alone, the GPU idle before it (synchronized
  first), the median of 50. What the host spends on one call, with no GPU work to
  hide behind. Where it is above the GPU time, the host is the limit.
- GPU (graph_microseconds): calls captured in one CUDA graph, the graph replayed,
  the median replay divided by the calls in it. The GPU's own time, the host taken
  out: a replay launches every kernel of the graph at once. The operands are the
  same in every call, so they stay in L2 where they fit, as in a layer run again.
  At the largest shapes some lines' replays have read above the wall time of the
  same calls run eagerly (fast/NOTES.md has the figures; the cause was not
  measured): compare a GPU time with GPU times, a wall time with wall times.
  Where lines are compared (bench.py's tables A and D), graphs_in_turn replays
  their graphs in turn instead, in both directions (it says why).

And a fourth figure, for forward_variants.py's plans at large shapes: throughput
(input_sets, milliseconds_per_call), each call on fresh operands rotated past the L2.

Needs a GPU; importing it does not (torch alone).
"""

import math
import statistics
import time
from typing import NamedTuple

import torch

# The shapes that both scripts time. The forward's are (M, N, K): the lesson's two
# (its README and test_op.py), and four large ones, where the Hopper kernels run. The
# step's are (M, K, N): one layer, x (M x K) @ w (K x N), from the lesson's size to a
# large layer.
FORWARD_SHAPES = [(256, 512, 384), (512, 1024, 128), (2048, 2048, 2048), (4096, 4096, 4096),
                  (8192, 4096, 4096), (8192, 8192, 8192)]
STEP_SIZES = [(256, 384, 512), (2048, 512, 2048), (4096, 1024, 4096), (8192, 4096, 4096)]


def layer_operands(m, k, n, requires_grad=False):
    """One layer's x (M x K) and w (K x N), FP16, and an FP32 grad (M x N), from a
    fixed seed: the same values in every table and every process."""
    torch.manual_seed(0)
    return (torch.randn(m, k, device="cuda", dtype=torch.half, requires_grad=requires_grad),
            torch.randn(k, n, device="cuda", dtype=torch.half, requires_grad=requires_grad),
            torch.randn(m, n, device="cuda"))


class Figures(NamedTuple):
    """Microseconds per call: see this module's docstring."""
    wall: float
    host: float
    gpu: float


def calls_for(m, n, k):
    """How many calls a measurement strings together: 200 where a call is short
    (under 2^33 multiply-adds), else 20. Enough that a graph replay or a loop lasts
    milliseconds, few enough that the largest shapes take about a second."""
    return 200 if m * n * k < 2**33 else 20


def wall_microseconds(call, calls):
    """Wall time per call: five calls to warm up (a module's first launch, cuBLAS's
    heuristics, the caching allocator), then `calls` calls back to back and one
    synchronize, the elapsed time divided by `calls`."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / calls


def host_alone(call, repeats=50):
    """Median host microseconds of one call, the GPU idle before each: the time
    until the call returns, its kernels queued and not waited for."""
    call()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append(1e6 * (time.perf_counter() - start))
    torch.cuda.synchronize()
    return statistics.median(times)


def captured(call, calls):
    """`calls` calls captured in one CUDA graph (warmed up on a side stream first, as
    capture requires), replayed once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_microseconds(graph, calls):
    """One replay of `graph`, in microseconds per call of the `calls` it holds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / calls


def graph_microseconds(call, calls=200, replays=7):
    """GPU time per call with no host in the way: `calls` calls captured in one CUDA
    graph, the graph replayed, the median replay divided by `calls`."""
    graph = captured(call, calls)
    timings = [replay_microseconds(graph, calls) for _ in range(replays)]
    del graph
    return statistics.median(timings)


class InTurn(NamedTuple):
    """One line's GPU microseconds per call in one direction of graphs_in_turn: the
    median of its replays, and their spread, (slowest - fastest) / median."""
    median: float
    spread: float


def in_turn(times):
    median = statistics.median(times)
    return InTurn(median, (max(times) - min(times)) / median)


def graphs_in_turn(calls_of_lines, calls, rounds=7):
    """graph_microseconds for several lines at once, each line's graph replayed in
    turn with the others': a round replays every line once in order, then once in
    reverse. Returns (in order, reversed): each line's InTurn over its replays in
    that direction, the median and the spread. Timed one line after another, the
    order of the lines moved a GPU time at the largest shapes (by more than a 3%
    lead: fast/NOTES.md, "the position of a line"); in turn, a slow drift (of the
    card's clock, we guess) reaches every line alike. Each timed replay follows an
    untimed replay of the same graph, so that no line starts on what its neighbour
    left. A line's position still moves it at the largest shapes (the same row says
    by how much): the two directions show it, and a lead smaller than that is not
    shown."""
    graphs = [captured(call, calls) for call in calls_of_lines]
    in_order, reversed_order = ([[] for _ in graphs] for _ in range(2))

    def timed(index):
        graphs[index].replay()  # untimed: the timed replay follows this line's own work
        return replay_microseconds(graphs[index], calls)

    for _ in range(rounds):
        for index in range(len(graphs)):
            in_order[index].append(timed(index))
        for index in reversed(range(len(graphs))):
            reversed_order[index].append(timed(index))
    del graphs
    return ([in_turn(times) for times in in_order],
            [in_turn(times) for times in reversed_order])


def input_sets(m, n, k):
    """Enough (a, b) pairs of fresh random FP16 values (never zeros) that together
    they are twice the L2, at most 64 of them: a call that takes the next pair reads
    its operands from memory, as a layer does whose weights the rest of a model has
    pushed out of the cache."""
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    per_set = 2 * (m * k + k * n)
    count = min(64, max(1, math.ceil(2 * l2_bytes / per_set)))
    return [(torch.randn(m, k, device="cuda", dtype=torch.half),
             torch.randn(k, n, device="cuda", dtype=torch.half))
            for _ in range(count)]


def milliseconds_per_call(function, sets, target_ms=20.0, timings=15):
    """Throughput with the operands rotated past the L2 (input_sets): calls on each
    pair in turn, back to back, enough of them to last about target_ms, timed by CUDA
    events; the median of `timings` such runs, per call."""
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
    samples = []
    for _ in range(timings):
        start.record()
        for call in range(calls):
            function(*sets[call % len(sets)])
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return statistics.median(samples)


def measure(call, calls):
    """The three figures of `call`, `calls` calls in the wall loop and in the graph."""
    wall = wall_microseconds(call, calls)
    host = host_alone(call)
    return Figures(wall, host, graph_microseconds(call, calls=calls))

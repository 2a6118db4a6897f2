"""figures_hold.py: do the fast tier's GPU times still hold? Its operator timed
beside an earlier commit's, on this machine, one right after the other, each in a
process of its own.

    python fast/figures_hold.py                              # against 30bd5dd, exported
                                                             # from this repository
    python fast/figures_hold.py --baseline-commit COMMIT     # against another commit
    python fast/figures_hold.py --baseline-commit COMMIT --baseline-fast
                                                             # against that commit's fast/
                                                             # (and its lesson files)
    python fast/figures_hold.py --baseline-folder DIR        # DIR: the commit's op.py,
                                                             # kernel.cu and binding.cpp,
                                                             # exported beforehand
    python fast/figures_hold.py --child FOLDER MODULE        # one side's figures, one JSON line

The rule (issue 34): the fast operator's GPU-time figures stay within 5% of
30bd5dd's. At 30bd5dd the tuned operator was the top-level op.py (namespace day87,
its backward on tensor cores); now it is fast/fast_op.py (day87_fast). The earlier
commit's folder is exported with `git archive` (the three files its operator is
built from) unless --baseline-folder names one: a copy of the repository whose git
is absent or stale needs that, made with
    git -C REPOSITORY archive 30bd5dd op.py kernel.cu binding.cpp | tar -x -C DIR

Each side runs in a child process, `--child FOLDER MODULE`: FOLDER first on
sys.path, MODULE imported from it (op from DIR, fast_op from fast/, which imports
this repository's lesson), and nothing else of either side. A child times, with
fast/timing.py, the module's wmma_mm: the forward at bench.py's shapes and at
those of checks/bench.py's table 1 at 30bd5dd; one layer's training step at
bench.py's four step sizes; and the backward alone at those sizes, through the
namespace's wmma_mm_backward operator, which each side's autograd backward calls.
(Not through autograd: it runs a backward's kernels on the forward's stream, which
is outside the CUDA graph being captured unless the forward is captured too, as
in the step.) Inputs come from a fixed seed, so both sides time the same values.
Each figure has wall, host and GPU times (timing.py says what each measures).

The parent runs the pair twice, the earlier commit first and then now, then now
first, so that a drift of the machine (clocks, heat, a neighbour) shows as a pair
that disagrees with the other. It prints every figure of both pairs with its ratio
now / earlier, and for each GPU time a verdict: "holds" within 5%, "SLOWER" when
more than 5% slower. Wall and host times are reported, not judged: they are the
host's, which a kernel's change does not decide. The exit status is 1 if a GPU
time is more than 5% slower in both pairs, 2 if a side could not be measured.

The two sides' extensions never share a build: op.py's build folder is named by a
hash of its kernel.cu and binding.cpp (day87-HASH, then and now), so 30bd5dd's
sources and the lesson's land in different folders; the parent checks that no
library was loaded by both sides. wmma_mm_bias did not exist at 30bd5dd and is not
compared.

With --baseline-fast the earlier side is the commit's own fast tier: its fast/ and
the lesson files it builds on (BASELINE_FAST_FILES), exported the same way (or a
copy of them in --baseline-folder), timed through its fast_op. Both sides then
serve day87_fast, each in its own process, and both may load the same lesson
library; only the libraries of the namespace timed must differ.
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile

import torch

import timing  # from fast/, this script's folder, which holds no op.py

FAST = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(FAST)
BASELINE_COMMIT = "30bd5dd"
BASELINE_FILES = ("op.py", "kernel.cu", "binding.cpp")  # what 30bd5dd's op.py builds and loads
# a later commit's fast tier and the lesson it imports
BASELINE_FAST_FILES = (*BASELINE_FILES, "fast")
# Each side's module and the namespace of its operators: 30bd5dd's op.py served
# day87 with the tensor-core backward; now fast_op.py serves day87_fast.
NAMESPACES = {"op": "day87", "fast_op": "day87_fast"}
# (M, N, K): table 1 of checks/bench.py at 30bd5dd, the forward's GPU time.
BASELINE_FORWARD_SHAPES = [(256, 512, 384), (512, 1024, 128), (1024, 1024, 1024), (2048, 2048, 512),
                           (2048, 2048, 2048)]
TOLERANCE = 1.05  # now / earlier, for a GPU time
CHILD_MARK = "figures_hold child: "  # starts the child's JSON line, among whatever a build prints


def child(folder, module_name):
    """One side's figures: MODULE imported from FOLDER, its wmma_mm timed; printed as
    one JSON line after CHILD_MARK."""
    folder = os.path.abspath(folder)
    sys.path.insert(0, folder)
    operator = importlib.import_module(module_name)
    imported_from = os.path.dirname(os.path.abspath(operator.__file__))
    if imported_from != folder:
        stop(f"{module_name} came from {imported_from}, not {folder}")
    if module_name == "op" and "fast_op" in sys.modules:
        stop("the earlier commit's side imported this repository's fast_op")
    backward = getattr(torch.ops, NAMESPACES[module_name]).wmma_mm_backward

    figures = {}
    forward_shapes = list(dict.fromkeys(timing.FORWARD_SHAPES + BASELINE_FORWARD_SHAPES))
    for m, n, k in forward_shapes:
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        b = torch.randn(k, n, device="cuda", dtype=torch.half)
        figures[f"forward M={m} N={n} K={k}"] = timing.measure(lambda: operator.wmma_mm(a, b),
                                                               timing.calls_for(m, n, k))
    for m, k, n in timing.STEP_SIZES:
        x, w, grad = timing.layer_operands(m, k, n, requires_grad=True)
        figures[f"step M={m} K={k} N={n}"] = timing.measure(
            lambda: torch.autograd.grad(operator.wmma_mm(x, w), (x, w), grad),
            timing.calls_for(m, n, k))
    for m, k, n in timing.STEP_SIZES:
        x, w, grad = timing.layer_operands(m, k, n, requires_grad=True)
        x16, w16 = x.detach(), w.detach()
        figures[f"backward M={m} K={k} N={n}"] = timing.measure(lambda: backward(grad, x16, w16),
                                                                timing.calls_for(m, n, k))
    print(CHILD_MARK + json.dumps({
        "operator": operator.__file__, "libraries": sorted(torch.ops.loaded_libraries),
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "figures": {name: value._asdict() for name, value in figures.items()}}), flush=True)


def stop(message):
    """A side cannot be measured: say why, exit 2."""
    print(f"figures_hold: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def export(repository, commit, folder, paths):
    """`paths` at `commit`, from `repository`'s git, into `folder`."""
    archive = subprocess.run(["git", "-C", repository, "archive", "--format=tar", commit, *paths],
                             capture_output=True)
    if archive.returncode != 0:
        stop(f"git archive {commit} failed in {repository}: {archive.stderr.decode().strip()}. "
             "Export the files beforehand and pass --baseline-folder.")
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)


def run_side(folder, module_name):
    """A child's figures; its stderr (a build's messages) passes through."""
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", folder, module_name],
        stdout=subprocess.PIPE, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith(CHILD_MARK)]
    if result.returncode != 0 or not lines:
        print(result.stdout)
        stop(f"the child for {module_name} from {folder} failed (exit {result.returncode})")
    return json.loads(lines[-1][len(CHILD_MARK):])


def libraries_of(side, namespace):
    """The libraries a side loaded, or only those serving `namespace` (op.py's build
    folders are named NAMESPACE-HASH, fast_op.py's too, through the lesson's build)."""
    return [library for library in side["libraries"]
            if namespace is None
            or os.path.basename(os.path.dirname(library)).startswith(namespace + "-")]


def verdict(ratios):
    """A GPU time's verdict from its ratio in each pair, and whether it fails."""
    slower = [pair for pair, ratio in enumerate(ratios, 1) if ratio > TOLERANCE]
    if len(slower) == len(ratios):
        return "SLOWER", True
    if slower:
        return f"holds (slower in pair {slower[0]} alone: drift?)", False
    return "holds", False


def report(label, pairs):
    """Print both pairs' figures side by side; returns whether a GPU time failed."""
    head = pairs[0]["now"]
    print(f"device: {head['device']}, torch {head['torch']}, CUDA {head['cuda']}")
    for name in ("baseline", "now"):
        print(f"{label if name == 'baseline' else 'now'}: {pairs[0][name]['operator']}, libraries "
              + ", ".join(pairs[0][name]["libraries"]))
    print("pair 1: the earlier commit first, then now; pair 2: now first. "
          f"Microseconds per call; ratio: now / {label}; "
          f"GPU times within {TOLERANCE - 1:.0%} hold\n")
    pair_columns = f"{label:>10}{'now':>10}{'ratio':>8} |"
    print(f"{'figure':<30}{'time':<6}" + pair_columns * 2 + " verdict")
    failed = False
    for figure in head["figures"]:
        for kind in ("gpu", "wall", "host"):
            cells, ratios = "", []
            for pair in pairs:
                earlier, now = (pair["baseline"]["figures"][figure][kind],
                                pair["now"]["figures"][figure][kind])
                ratios.append(now / earlier)
                cells += f"{earlier:>10.2f}{now:>10.2f}{now / earlier:>8.3f} |"
            said, fails = verdict(ratios) if kind == "gpu" else ("reported", False)
            failed |= fails
            print(f"{figure if kind == 'gpu' else '':<30}"
                  f"{kind if kind != 'gpu' else 'GPU':<6}{cells} {said}",
                  flush=True)
    return failed


def parent(arguments):
    if not torch.cuda.is_available():
        print("figures_hold.py needs a GPU; nothing to measure here.")
        return 0
    with tempfile.TemporaryDirectory(prefix="figures-hold-") as scratch:
        folder = arguments.baseline_folder
        paths = BASELINE_FAST_FILES if arguments.baseline_fast else BASELINE_FILES
        if folder is None:
            folder = scratch
            export(arguments.repository, arguments.baseline_commit, folder, paths)
        baseline = ((os.path.join(folder, "fast"), "fast_op") if arguments.baseline_fast
                    else (folder, "op"))
        if not os.path.exists(os.path.join(baseline[0], baseline[1] + ".py")):
            stop(f"{baseline[0]} holds no {baseline[1]}.py; "
                 f"it needs {', '.join(paths)} at {arguments.baseline_commit}")
        sides = {"baseline": baseline, "now": (FAST, "fast_op")}
        pairs = []
        for order in (("baseline", "now"), ("now", "baseline")):
            pairs.append({side: run_side(*sides[side]) for side in order})
    for pair in pairs:
        # Two fast tiers share the lesson's library; the operator timed must not be one.
        namespace = NAMESPACES["fast_op"] if arguments.baseline_fast else None
        shared = (set(libraries_of(pair["baseline"], namespace))
                  & set(libraries_of(pair["now"], namespace)))
        if shared:
            stop(f"both sides loaded {', '.join(sorted(shared))}: they are not two operators")
    return 1 if report(arguments.baseline_commit, pairs) else 0


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-commit", default=BASELINE_COMMIT,
                        help=f"the commit compared with (default {BASELINE_COMMIT}); "
                        "with --baseline-folder, the commit that folder holds, named in the table")
    parser.add_argument("--baseline-folder",
                        help="a folder holding the commit's op.py, kernel.cu, binding.cpp "
                        "(and fast/, with --baseline-fast)")
    parser.add_argument("--baseline-fast", action="store_true",
                        help="compare with the commit's fast tier (its fast/ and lesson files), "
                        "not its op.py")
    parser.add_argument("--repository", default=REPOSITORY,
                        help="where to export the commit from (git)")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "MODULE"),
                        help="one side's figures (internal)")
    arguments = parser.parse_args()
    if arguments.child:
        folder, module_name = arguments.child
        if module_name not in NAMESPACES:
            parser.error(f"MODULE is one of {', '.join(NAMESPACES)}")
        return child(folder, module_name)
    return parent(arguments)


if __name__ == "__main__":
    sys.exit(main())

"""figures_hold.py: do the fast tier's GPU times still hold? The installed operator
(`pip install --no-build-isolation ./fast`) timed beside an earlier commit's fast tier,
built just in time, on this machine, one right after the other, each in a process of its
own.

From fast/:
    python -m bench.figures_hold                             # against 3fa032f, exported
                                                             # from this repository
    python -m bench.figures_hold --baseline-commit COMMIT    # against another commit
    python -m bench.figures_hold --baseline-folder DIR       # DIR: the commit's fast/ and
                                                             # lesson files, exported
                                                             # beforehand
    python bench/figures_hold.py --child FOLDER MODULE       # one side's figures, one JSON line

The rule (issue 34): the fast operator's GPU-time figures stay within 5% of an
earlier commit's. The earlier commit's fast/ and the lesson files it builds on
(BASELINE_FILES) are exported with `git archive` unless --baseline-folder names a
copy: a repository whose git is absent or stale needs that, made with
    git -C REPOSITORY archive 3fa032f op.py kernel.cu binding.cpp fast | tar -x -C DIR
Its operator is the module its fast/ holds, built at import: day87_fast (a package, in
the commits that laid fast/ out by role) or fast_op.py (before them). Now's is the
installed day87_fast, wherever Python finds it (site-packages, or a folder on
PYTHONPATH): its wall and host times beside 3fa032f's show what the stable ABI's
boxed calls cost the host.

Each side runs in a child process, `--child FOLDER MODULE`, started by this file's
path with FOLDER alone on PYTHONPATH: MODULE is imported from FOLDER (the earlier
side's fast/, which imports its own lesson; now's, the folder the installed package is
in), and nothing else of either side; timing.py
comes from this file's folder. A child times, with bench/timing.py, the module's
wmma_mm: the forward at bench.py's shapes and at five more (BASELINE_FORWARD_SHAPES);
one layer's training step at bench.py's four step sizes; and the backward alone at
those sizes, through day87_fast's wmma_mm_backward operator, which each side's
autograd backward calls. (Not through autograd: it runs a backward's kernels on the
forward's stream, which is outside the CUDA graph being captured unless the forward
is captured too, as in the step.) Inputs come from a fixed seed, so both sides time
the same values. Each figure has wall, host and GPU times (timing.py says what each
measures).

The parent runs the pair twice, the earlier commit first and then now, then now
first, so that a drift of the machine (clocks, heat, a neighbour) shows as a pair
that disagrees with the other. It prints every figure of both pairs with its ratio
now / earlier, and for each GPU time a verdict: "holds" within 5%, "SLOWER" when
more than 5% slower. Wall and host times are reported, not judged: they are the
host's, which a kernel's change does not decide. The exit status is 1 if a GPU
time is more than 5% slower in both pairs, 2 if a side could not be measured.

Both sides serve day87_fast, and the earlier one loads its lesson's library too; the
libraries of day87_fast must differ, and the parent checks that they do.
"""

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import torch

FAST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPOSITORY = os.path.dirname(FAST)
BASELINE_COMMIT = "3fa032f"  # the last commit before fast/ was laid out by role
BASELINE_FILES = ("op.py", "kernel.cu", "binding.cpp", "fast")  # its fast tier and lesson
# Where a side's operator lives in its fast/: the package, or the module before it.
MODULES = ("day87_fast", "fast_op")
NAMESPACE = "day87_fast"
# (M, N, K): five more forward shapes, from the lesson's to 2048^3.
BASELINE_FORWARD_SHAPES = [(256, 512, 384), (512, 1024, 128), (1024, 1024, 1024), (2048, 2048, 512),
                           (2048, 2048, 2048)]
TOLERANCE = 1.05  # now / earlier, for a GPU time
CHILD_MARK = "figures_hold child: "  # starts the child's JSON line, among whatever a build prints


def child(folder, module_name):
    """One side's figures: MODULE imported from FOLDER, its wmma_mm timed; printed as
    one JSON line after CHILD_MARK."""
    import timing  # this file's folder, sys.path[0] for a child started by its path

    folder = os.path.abspath(folder)
    operator = importlib.import_module(module_name)  # from FOLDER, on PYTHONPATH
    imported_from = os.path.abspath(operator.__file__)
    if os.path.commonpath([imported_from, folder]) != folder:
        stop(f"{module_name} came from {imported_from}, not from {folder}")
    backward = torch.ops.day87_fast.wmma_mm_backward

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


def module_in(folder):
    """The operator's module in a side's fast/ FOLDER, or None."""
    for name in MODULES:
        if os.path.exists(os.path.join(folder, name)) or os.path.exists(
                os.path.join(folder, name + ".py")):
            return name
    return None


def run_side(folder, module_name):
    """A child's figures; its stderr (a build's messages) passes through."""
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", folder, module_name],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=folder))
    lines = [line for line in result.stdout.splitlines() if line.startswith(CHILD_MARK)]
    if result.returncode != 0 or not lines:
        print(result.stdout)
        stop(f"the child for {module_name} from {folder} failed (exit {result.returncode})")
    return json.loads(lines[-1][len(CHILD_MARK):])


def libraries_of(side, namespace):
    """The libraries a side loaded that serve `namespace`: a just-in-time build's folder is
    named NAMESPACE-HASH, an installed package's NAMESPACE."""
    folders = [os.path.basename(os.path.dirname(library)) for library in side["libraries"]]
    return [library for library, folder in zip(side["libraries"], folders)
            if folder == namespace or folder.startswith(namespace + "-")]


def installed_folder():
    """The folder the installed day87_fast package is in, found without importing it."""
    spec = importlib.util.find_spec(NAMESPACE)
    if spec is None or spec.origin is None:
        stop("day87_fast is not installed. Fix: pip install --no-build-isolation ./fast")
    return os.path.dirname(os.path.dirname(spec.origin))


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
        if folder is None:
            folder = scratch
            export(arguments.repository, arguments.baseline_commit, folder, BASELINE_FILES)
        baseline_fast = os.path.join(folder, "fast")
        if module_in(baseline_fast) is None:
            stop(f"{baseline_fast} holds neither {' nor '.join(MODULES)}; "
                 f"it needs {', '.join(BASELINE_FILES)} at {arguments.baseline_commit}")
        sides = {"baseline": (baseline_fast, module_in(baseline_fast)),
                 "now": (installed_folder(), NAMESPACE)}
        pairs = []
        for order in (("baseline", "now"), ("now", "baseline")):
            pairs.append({side: run_side(*sides[side]) for side in order})
    for pair in pairs:
        # Two fast tiers share the lesson's library; the operator timed must not be one.
        shared = (set(libraries_of(pair["baseline"], NAMESPACE))
                  & set(libraries_of(pair["now"], NAMESPACE)))
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
                        "and fast/")
    parser.add_argument("--repository", default=REPOSITORY,
                        help="where to export the commit from (git)")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "MODULE"),
                        help="one side's figures (internal)")
    arguments = parser.parse_args()
    if arguments.child:
        folder, module_name = arguments.child
        if module_name not in MODULES:
            parser.error(f"MODULE is one of {', '.join(MODULES)}")
        return child(folder, module_name)
    return parent(arguments)


if __name__ == "__main__":
    sys.exit(main())

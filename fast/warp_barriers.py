"""warp_barriers.py: the epilogue's warp barriers, read from the compiled program.

    python fast/warp_barriers.py            (needs nvcc; no GPU)

Each warp of wmmaGemmKernel (the lesson's and every plan of the fast tier's) ends by
staging its output in shared memory, 16 rows at a time: it stores a strip of
fragments there, reads the strip back out in whole rows, and stores the next strip
over it. A lane reads what other lanes wrote and overwrites what other lanes read,
so each turn from writing the staging memory to reading it, and from reading it to
writing it again, needs a warp barrier between them (__syncwarp(); bar.warp.sync in
PTX): that is what the CUDA memory model asks for.

No gate's output shows a missing one, on the H200 in sm_90 and compute_75 code:
the next strip's wmma.store is itself warp-synchronous (its .sync makes each lane
wait there for the whole warp), and a converged warp's shared-memory accesses are
carried out in order. So the gate passes, and the code is still wrong: a later
compiler or card need not keep the accident. compute-sanitizer's racecheck, which
records every lane's accesses, does report it, on a GPU (checks/NOTES.md has the
runs). This check needs no GPU, so CI runs it on every change. It reads the
program: it compiles fast/kernel.cu to PTX and walks each wmmaGemmKernel from its
epilogue's first store to shared memory to its end, a straight run of code (the
epilogue's loops are unrolled; a backward branch there is reported, since this walk
cannot follow it), requiring a barrier wherever the accesses to shared memory turn
from writes to reads or from reads to writes. It exits 0 when every kernel has its
barriers, 1 otherwise.
"""

import os
import re
import subprocess
import sys
import tempfile

FAST = os.path.dirname(os.path.abspath(__file__))
# The PTX of these two architectures: the copies differ below and from sm_80, the
# epilogue does not, and a compiler may still schedule each differently.
ARCHITECTURES = ("75", "90")

BARRIER = re.compile(r"^\s*(?:bar|barrier)\.(?:warp\.)?sync\b")
SHARED_WRITE = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:st\.shared|wmma\.store\.\S*\.shared|cp\.async\S*\.shared)")
SHARED_READ = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld\.shared|wmma\.load\.\S*\.shared)")
EPILOGUE_START = re.compile(r"^\s*wmma\.store\.\S*\.shared")


def kernel_bodies(ptx):
    """{entry name: its lines} for every wmmaGemmKernel in the PTX text."""
    bodies = {}
    for match in re.finditer(r"^\.visible \.entry (\S*wmmaGemmKernel\S*)\($(.*?)^\}", ptx, re.MULTILINE | re.DOTALL):
        bodies[match.group(1)] = match.group(2).splitlines()
    return bodies


def missing_barriers_in(name, lines):
    """The epilogue's accesses to shared memory that turn direction with no barrier
    between them, each as a line of text; or why the walk cannot judge this kernel."""
    start = next((i for i, line in enumerate(lines) if EPILOGUE_START.match(line)), None)
    if start is None:
        return [f"{name}: no wmma.store to shared memory: not the epilogue this check knows"]
    labels = {}
    problems, last_access, last_line = [], None, ""
    for number, line in enumerate(lines):
        label = re.match(r"^(\$\w+):", line)
        if label:
            labels[label.group(1)] = number
        branch = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)
        if number >= start and branch and branch.group(1) in labels and labels[branch.group(1)] >= start:
            problems.append(f"{name}: the epilogue branches back (a loop this walk cannot follow): {line.strip()}")
        if BARRIER.match(line):
            last_access = None
            continue
        access = "write" if SHARED_WRITE.match(line) else "read" if SHARED_READ.match(line) else None
        if access is None:
            continue
        if number >= start and last_access is not None and access != last_access:
            problems.append(f"{name}: a shared-memory {access} follows a {last_access} with no barrier between:\n"
                            f"      {last_line.strip()}\n      {line.strip()}")
        last_access, last_line = access, line
    return problems


def missing_barriers(folder):
    """Every problem in `folder`'s fast/kernel.cu (which includes the lesson's
    kernel.cu), for each architecture; an empty list when there is none."""
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc = nvcc if os.path.exists(nvcc) else "nvcc"
    problems = []
    with tempfile.TemporaryDirectory(prefix="day87-ptx-") as scratch:
        for architecture in ARCHITECTURES:
            ptx_file = os.path.join(scratch, f"kernel_{architecture}.ptx")
            subprocess.run([nvcc, "-O3", "-ptx", f"-arch=compute_{architecture}", "-o", ptx_file,
                            os.path.join(folder, "fast", "kernel.cu")], check=True)
            with open(ptx_file) as file:
                bodies = kernel_bodies(file.read())
            if not bodies:
                problems.append(f"compute_{architecture}: no wmmaGemmKernel in the PTX")
            for name, lines in bodies.items():
                problems += [f"compute_{architecture} {problem}" for problem in missing_barriers_in(name, lines)]
            print(f"compute_{architecture}: {len(bodies)} wmmaGemmKernel(s) walked")
    return problems


def main():
    problems = missing_barriers(os.path.dirname(FAST))
    for problem in problems:
        print(problem)
    print("warp_barriers: " + (f"{len(problems)} problem(s)" if problems else "every epilogue has its barriers"))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

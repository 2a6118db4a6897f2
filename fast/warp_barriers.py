"""warp_barriers.py: the epilogue's warp barriers, read from the compiled program.

    python fast/warp_barriers.py            (needs nvcc; no GPU)

Each warp of wmmaGemmKernel (the lesson's and every plan of the fast tier's) ends by
staging its output in shared memory, 16 rows at a time: it stores a strip of
fragments there, reads the strip back out in whole rows, and stores the next strip
over it. A lane reads what other lanes wrote and overwrites what other lanes read,
so each turn from writing the staging memory to reading it, and from reading it to
writing it again, needs a warp barrier between them (__syncwarp(); bar.warp.sync in
PTX): that is what the CUDA memory model asks for.

No gate's output shows a missing one, on the H200 in sm_90 and compute_75 code,
likely because the next strip's wmma.store is itself warp-synchronous (its .sync
makes each lane wait there for the whole warp) and a converged warp's shared-memory
accesses are carried out in order. So the gate passes, and the code is still wrong:
a later compiler or card need not keep the accident. compute-sanitizer's racecheck, which
records every lane's accesses, does report it, on a GPU (checks/NOTES.md has the
runs). This check needs no GPU, so CI runs it on every change. It reads the
program: it compiles fast/launch_policy.cu (version 1's plans) and the lesson's
kernel.cu, each to PTX, and follows every path through each
wmmaGemmKernel's epilogue, from the __syncthreads() before its first store to
shared memory to the kernel's end, branches and loops included, requiring a barrier
wherever the accesses to shared memory can turn from writes to reads or from reads
to writes. It exits 0 when every kernel has its barriers, 1 otherwise.

The Hopper kernels (hopperGemmKernel, hopperPersistentKernel) are out of its scope:
their epilogue (storeTile) stores C straight from each thread's accumulator
registers, with no shared memory between lanes, so there is no barrier to ask for.
What can go wrong there instead, reading the accumulators before the warpgroup's
MMAs are done, fast/wgmma_order.py reads from the PTX, and what the epilogue stores,
fast/gate.cu checks against float64.
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

WARP_BARRIER = re.compile(r"^\s*(@!?%\w+\s+)?bar\.warp\.sync\b")  # __syncwarp()
BLOCK_BARRIER = re.compile(r"^\s*(@!?%\w+\s+)?(?:bar|barrier)(?:\.cta)?\.sync\b")  # __syncthreads()
SHARED_WRITE = re.compile(r"^\s*(@!?%\w+\s+)?"
                          r"(?:st\.shared|wmma\.store\.\S*\.shared|cp\.async\S*\.shared)")
SHARED_READ = re.compile(r"^\s*(@!?%\w+\s+)?(?:ld\.shared|wmma\.load\.\S*\.shared)")
EPILOGUE_STORE = re.compile(r"^\s*wmma\.store\.\S*\.shared")
LABEL = re.compile(r"^(\$\w+):")
BRANCH = re.compile(r"^\s*(@!?%\w+\s+)?bra(?:\.uni)?\s+(\$\w+);")
END = re.compile(r"^\s*(?:ret|exit);")
NOTHING_YET = ("barrier", -1)  # the state just after a barrier: no access to pair with


def kernel_bodies(ptx):
    """{entry name: its lines} for every wmmaGemmKernel in the PTX text, and the names
    of those whose body this pattern could not find (each is a problem)."""
    names = re.findall(r"\.entry (\S*wmmaGemmKernel\S*)\(", ptx)
    bodies = {match.group(1): match.group(2).splitlines() for match in re.finditer(
        r"\.entry (\S*wmmaGemmKernel\S*)\($(.*?)^\}", ptx, re.MULTILINE | re.DOTALL)}
    return bodies, [name for name in names if name not in bodies]


def missing_barriers_in(name, lines):
    """The epilogue's accesses to shared memory that can turn direction with no
    barrier between them, on any path, each as text; or why this kernel cannot be
    judged. The epilogue runs from the block barrier (__syncthreads) before its first
    wmma.store to shared memory to the kernel's end; every path through it is
    followed, branches and loops included: at each instruction, the set of accesses
    that can be the last one before it, from every way in, until nothing changes."""
    first_store = next((i for i, line in enumerate(lines) if EPILOGUE_STORE.match(line)), None)
    if first_store is None:
        return [f"{name}: no wmma.store to shared memory: not the epilogue this check knows"]
    start = next((i for i in range(first_store, -1, -1)
                  if BLOCK_BARRIER.match(lines[i])
                  and not BLOCK_BARRIER.match(lines[i]).group(1)), None)
    if start is None:
        return [f"{name}: no __syncthreads() before the epilogue's first store"]
    labels = {match.group(1): i for i, line in enumerate(lines)
              for match in [LABEL.match(line)] if match}
    problems = []
    # The walk starts at the __syncthreads(): a way into the epilogue that passes it
    # by would bring accesses the walk never sees.
    for i, line in enumerate(lines[:start]):
        branch = BRANCH.match(line)
        if branch and labels.get(branch.group(2), -1) > start:
            problems.append(f"{name}: a branch into the epilogue past its __syncthreads(), "
                            f"which this check does not follow: {line.strip()}")

    def successors(i):
        branch = BRANCH.match(lines[i])
        if branch:
            target = labels.get(branch.group(2))
            if target is None or target < start:
                problems.append(f"{name}: a branch from the epilogue to "
                                + ("a label this check did not find" if target is None else
                                   "before its __syncthreads()")
                                + f", which it does not follow: {lines[i].strip()}")
                target = None
            following = [i + 1] if branch.group(1) else []  # a predicated branch may fall through
            return following + ([target] if target is not None else [])
        if re.search(r"\b(?:bra|brx)\b", lines[i]):  # a branch of a form BRANCH does not read
            problems.append(f"{name}: a branch this check cannot read: {lines[i].strip()}")
        return [] if END.match(lines[i]) else [i + 1]

    arriving = {start + 1: {NOTHING_YET}}  # instruction -> the last accesses that can precede it
    unpaired = set()  # (earlier access's line, its kind, later access's line, its kind)
    pending = [start + 1]
    while pending:
        i = pending.pop()
        if i >= len(lines):
            continue
        state, line = arriving[i], lines[i]
        barrier = WARP_BARRIER.match(line) or BLOCK_BARRIER.match(line)
        write, read = SHARED_WRITE.match(line), SHARED_READ.match(line)
        access = "write" if write else "read" if read else None
        if barrier:
            # a predicated one may not run
            leaving = {NOTHING_YET} | (state if barrier.group(1) else set())
        elif access:
            unpaired |= {(j, kind, i, access) for kind, j in state
                         if kind not in (access, "barrier")}
            # predicated: may not run
            leaving = {(access, i)} | (state if (write or read).group(1) else set())
        else:
            leaving = state
        for following in successors(i):
            before = arriving.setdefault(following, set())
            if not leaving <= before:
                before |= leaving
                pending.append(following)
    for j, earlier, i, later in sorted(unpaired, key=lambda pair: (pair[2], pair[0])):
        problems.append(f"{name}: a shared-memory {later} can follow a {earlier} "
                        "with no barrier between:\n"
                        f"      {lines[j].strip()}\n      {lines[i].strip()}")
    return list(dict.fromkeys(problems))


def nvcc():
    """CUDA_HOME's nvcc, else the one on PATH."""
    named = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return named if os.path.exists(named) else "nvcc"


# The sources whose wmmaGemmKernels are walked: fast/'s launcher (which includes every
# version) and the lesson's kernel, which stages its output the same way.
SOURCES = [os.path.join("fast", "launch_policy.cu"), "kernel.cu"]


def compiled_ptx(folder, architecture):
    """The PTX of `folder`'s SOURCES for compute_`architecture`, as one text."""
    texts = []
    with tempfile.TemporaryDirectory(prefix="day87-ptx-") as scratch:
        for index, source in enumerate(SOURCES):
            ptx_file = os.path.join(scratch, f"source{index}_{architecture}.ptx")
            subprocess.run([nvcc(), "-O3", "-ptx", f"-arch=compute_{architecture}", "-o",
                            ptx_file, os.path.join(folder, source)], check=True)
            with open(ptx_file) as file:
                texts.append(file.read())
    return "\n".join(texts)


def missing_barriers(folder):
    """Every problem in `folder`'s kernels, for each architecture; an empty list when
    there is none."""
    problems = []
    for architecture in ARCHITECTURES:
        bodies, unread = kernel_bodies(compiled_ptx(folder, architecture))
        if not bodies:
            problems.append(f"compute_{architecture}: no wmmaGemmKernel in the PTX")
        problems += [f"compute_{architecture} {name}: its body could not be read"
                     for name in unread]
        for name, lines in bodies.items():
            problems += [f"compute_{architecture} {problem}"
                         for problem in missing_barriers_in(name, lines)]
        print(f"compute_{architecture}: {len(bodies)} wmmaGemmKernel(s) walked")
    return problems


def main():
    problems = missing_barriers(os.path.dirname(FAST))
    for problem in problems:
        print(problem)
    print("warp_barriers: "
          + (f"{len(problems)} problem(s)" if problems else "every epilogue has its barriers")
          + " (the Hopper kernels are out of scope: their epilogue shares nothing between lanes; "
            "fast/wgmma_order.py checks their MMAs, fast/gate.cu their output)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

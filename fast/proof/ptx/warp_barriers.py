"""warp_barriers.py: the epilogue's warp barriers, read from the compiled program.

    python -m proof.ptx.warp_barriers      (from fast/; needs nvcc, no GPU)

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
records every lane's accesses, does report it, on a GPU (fast/NOTES.md has the
runs). This check needs no GPU, so CI runs it on every change. It reads the
program: it compiles fast/csrc/launch_policy.cu (version 1's plans) and the lesson's
kernel.cu, each to PTX, and follows every path through each
wmmaGemmKernel's epilogue, from the __syncthreads() before its first store to
shared memory to the kernel's end, branches and loops included, requiring a barrier
wherever the accesses to shared memory can turn from writes to reads or from reads
to writes. It exits 0 when every kernel has its barriers, 1 otherwise.

The Hopper kernels (hopperGemmKernel, hopperPersistentKernel) are out of its scope:
their epilogue (storeTile) stores C straight from each thread's accumulator
registers, with no shared memory between lanes, so there is no barrier to ask for.
What can go wrong there instead, reading the accumulators before the warpgroup's
MMAs are done, proof/ptx/wgmma_order.py reads from the PTX, and what the epilogue
stores, proof/gate.cu checks against float64.
"""

import re

from proof import ptx

# The PTX of these two architectures: the copies differ below and from sm_80, the
# epilogue does not, and a compiler may still schedule each differently.
ARCHITECTURES = ("75", "90")
# fast/'s launcher (which includes every version) and the lesson's kernel, which stages
# its output the same way.
SOURCES = (ptx.LAUNCH_POLICY, ptx.LESSON_KERNEL)
ENTRY = ptx.entry_named("wmmaGemmKernel")

WARP_BARRIER = re.compile(r"^\s*(@!?%\w+\s+)?bar\.warp\.sync\b")  # __syncwarp()
# __syncthreads()
BLOCK_BARRIER = re.compile(r"^\s*(@!?%\w+\s+)?(?:bar|barrier)(?:\.cta)?\.sync\b")
SHARED_WRITE = re.compile(r"^\s*(@!?%\w+\s+)?"
                          r"(?:st\.shared|wmma\.store\.\S*\.shared|cp\.async\S*\.shared)")
SHARED_READ = re.compile(r"^\s*(@!?%\w+\s+)?(?:ld\.shared|wmma\.load\.\S*\.shared)")
EPILOGUE_STORE = re.compile(r"^\s*wmma\.store\.\S*\.shared")
NOTHING_YET = ("barrier", -1)  # the state just after a barrier: no access to pair with


def missing_barriers_in(name, lines):
    """The epilogue's accesses to shared memory that can turn direction with no
    barrier between them, on any path, each as text; or why this kernel cannot be
    judged. The epilogue runs from the block barrier (__syncthreads) before its first
    wmma.store to shared memory to the kernel's end; every path through it is
    followed (ptx.follow_every_path), each state the last access that can precede an
    instruction."""
    first_store = next((i for i, line in enumerate(lines) if EPILOGUE_STORE.match(line)), None)
    if first_store is None:
        return [f"{name}: no wmma.store to shared memory: not the epilogue this check knows"]
    start = next((i for i in range(first_store, -1, -1)
                  if BLOCK_BARRIER.match(lines[i])
                  and not BLOCK_BARRIER.match(lines[i]).group(1)), None)
    if start is None:
        return [f"{name}: no __syncthreads() before the epilogue's first store"]
    labels = ptx.labels_in(lines)
    problems = []
    # The walk starts at the __syncthreads(): a way into the epilogue that passes it
    # by would bring accesses the walk never sees.
    for line in lines[:start]:
        branch = ptx.BRANCH.match(line)
        if branch and labels.get(branch.group(2), -1) > start:
            problems.append(f"{name}: a branch into the epilogue past its __syncthreads(), "
                            f"which this check does not follow: {line.strip()}")

    unpaired = set()  # (earlier access's line, its kind, later access's line, its kind)

    def transfer(i, state):
        line = lines[i]
        barrier = WARP_BARRIER.match(line) or BLOCK_BARRIER.match(line)
        write, read = SHARED_WRITE.match(line), SHARED_READ.match(line)
        access = "write" if write else "read" if read else None
        if barrier:
            # a predicated one may not run
            return {NOTHING_YET} | (state if barrier.group(1) else set())
        if access:
            unpaired.update((j, kind, i, access) for kind, j in state
                            if kind not in (access, "barrier"))
            # predicated: may not run
            return {(access, i)} | (state if (write or read).group(1) else set())
        return state

    problems += ptx.follow_every_path(name, lines, start + 1, {NOTHING_YET}, transfer,
                                      "the epilogue")
    for j, earlier, i, later in sorted(unpaired, key=lambda pair: (pair[2], pair[0])):
        problems.append(f"{name}: a shared-memory {later} can follow a {earlier} "
                        "with no barrier between:\n"
                        f"      {lines[j].strip()}\n      {lines[i].strip()}")
    return list(dict.fromkeys(problems))


def missing_barriers(folder):
    """Every problem in `folder`'s wmmaGemmKernels, for each architecture; an empty list
    when there is none."""
    return ptx.walk_kernels(folder, ARCHITECTURES, SOURCES, ENTRY, "wmmaGemmKernel",
                            missing_barriers_in)


if __name__ == "__main__":
    ptx.main("warp_barriers", missing_barriers, "every epilogue has its barriers",
             " (the Hopper kernels are out of scope: their epilogue shares nothing between "
             "lanes; proof/ptx/wgmma_order.py checks their MMAs, proof/gate.cu their output)")

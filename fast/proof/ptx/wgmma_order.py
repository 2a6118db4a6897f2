"""wgmma_order.py: the Hopper kernels' warpgroup MMAs (version 3's, and version 2's in its
study), fenced, committed and waited for, read from the compiled program.

    python -m proof.ptx.wgmma_order        (from fast/; needs nvcc, no GPU)

wgmma.mma_async runs after the instruction that issues it: it reads shared memory
and writes its accumulator registers while the warpgroup goes on. The PTX ISA asks
for three things around it, and a missing one can pass every run on one card and
one compiler:
  - wgmma.fence before the first MMA of a group, after the registers' last ordinary
    access (the zeros, or an earlier group's results);
  - wgmma.commit_group to close the group, and wgmma.wait_group before anything that
    needs it finished: the accumulators read (the epilogue's st.global), the stage
    handed back to the producer (mbarrier.arrive), the kernel's end;
  - no wait that leaves MMAs uncommitted behind it.
The model is the kernel's own, stricter than the ISA in two ways: every group that
starts with no group open begins with a fence (the ISA lets MMAs of one shape on the
same accumulators follow each other unfenced), and results are used only after
wait_group 0 (a kernel that hands a stage back after wait_group 1, keeping one group
in flight, would need the walk to count groups). It is laxer in one: it does not see
ordinary register accesses, so a fence counts for the next group whatever runs between
them (the zeros written after it, a wait_group and the stores included). A fence is
tracked apart from the groups, so a fence after a wait_group 1 opens the next group.
This check compiles fast/csrc/launch_policy.cu (what the package builds) and version 2's
study, fast/studies/version2_hopper.cu, to PTX for compute_90a (the only target where the
Hopper kernels have a body) and follows every path through each Hopper kernel
(hopperPersistentKernel in the first, hopperGemmKernel in the second, each plan),
branches and loops included, tracking which states each instruction can be reached in. Any MMA state
error on any path is a problem. A kernel with no MMA, no fence, no
commit or no wait at all is one too: then there is nothing to judge. It exits 0 when
every kernel's MMAs are in order, 1 otherwise.
"""

import re

from proof import ptx

ARCHITECTURE = "90a"
# Each source and the kernels walked in it: the study includes the package's launcher, so
# its PTX holds version 3 too, which is walked once, in the package's own.
WALKED = [(ptx.LAUNCH_POLICY, ptx.entry_named("hopperPersistentKernel")),
          (ptx.VERSION2_STUDY, ptx.entry_named("hopperGemmKernel"))]
FENCE = re.compile(r"^\s*wgmma\.fence\b")
MMA = re.compile(r"^\s*wgmma\.mma_async\b")
COMMIT = re.compile(r"^\s*wgmma\.commit_group\b")
WAIT = re.compile(r"^\s*wgmma\.wait_group\S*\s+(\d+);")
# What needs every MMA finished: a stage handed back, a store of the accumulators (to C,
# or to shared memory).
NEEDS_RESULTS = re.compile(
    r"^\s*(?:@!?%\w+\s+)?(?:mbarrier\.arrive(?:\.\w+)*\.shared|st\.global|st\.shared)\b")

# A state is (the groups' state, whether a fence is waiting for the next group). The
# groups: no MMA outstanding, MMAs issued (a group open), groups committed.
IDLE, ISSUED, COMMITTED = "no MMA outstanding", "MMAs issued", "committed"
START = (IDLE, False)


def step(state, line):
    """(the state after `line` from `state`; the problem it shows, or None)."""
    groups, fenced = state
    if FENCE.match(line):
        return (groups, True), None
    if MMA.match(line):
        if groups == ISSUED:  # the open group goes on
            return state, None
        return (ISSUED, False), (None if fenced else
                                 f"an MMA opens a group with no wgmma.fence before it ({groups})")
    if COMMIT.match(line):
        return (COMMITTED if groups == ISSUED else groups, fenced), None
    wait = WAIT.match(line)
    if wait:
        if groups == ISSUED:
            return state, "a wgmma.wait_group with MMAs not committed"
        return (IDLE if wait.group(1) == "0" else groups, fenced), None
    if NEEDS_RESULTS.match(line) and groups != IDLE:
        return state, (f"'{line.strip()[:60]}' while MMAs may still run "
                       f"({groups}, no wgmma.wait_group 0)")
    if ptx.END.match(line) and groups != IDLE:
        return state, f"the kernel ends while MMAs may still run ({groups})"
    return state, None


def order_problems_in(name, lines):
    """Every MMA-order problem on any path through this kernel, each as text."""
    problems = [f"{name}: no {what} at all: not the kernel this check knows" for what, pattern in
                (("wgmma.mma_async", MMA), ("wgmma.fence", FENCE), ("wgmma.commit_group", COMMIT),
                 ("wgmma.wait_group", WAIT)) if not any(pattern.match(line) for line in lines)]
    if problems:
        return problems

    def transfer(i, states):
        leaving = set()
        for state in states:
            after, problem = step(state, lines[i])
            leaving.add(after)
            if problem:
                problems.append(f"{name}: {problem}")
        return leaving

    problems += ptx.follow_every_path(name, lines, 0, {START}, transfer, "the kernel")
    return list(dict.fromkeys(problems))


def order_problems(folder):
    """Every problem in `folder`'s Hopper kernels; an empty list when there is none."""
    return [problem for source, entry in WALKED
            for problem in ptx.walk_kernels(folder, [ARCHITECTURE], [source], entry,
                                            "Hopper kernel", order_problems_in)]


if __name__ == "__main__":
    ptx.main("wgmma_order", order_problems,
             "every MMA fenced, committed and waited for before its results are used")

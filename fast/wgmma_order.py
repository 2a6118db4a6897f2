"""wgmma_order.py: the Hopper kernels' warpgroup MMAs, fenced, committed and waited for,
read from the compiled program.

    python fast/wgmma_order.py            (needs nvcc; no GPU)

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
This check compiles fast/launch_policy.cu (every version) to PTX for compute_90a (the
only target where the Hopper kernels have a body) and follows every path through each
Hopper kernel (hopperGemmKernel, hopperPersistentKernel and hopperClusterKernel, each
plan), branches and
loops included, tracking which states each instruction can be reached in. Any MMA state
error on any path is a problem. A kernel with no MMA, no fence, no
commit or no wait at all is one too: then there is nothing to judge. It exits 0 when
every kernel's MMAs are in order, 1 otherwise.
"""

import os
import re
import sys

FAST = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FAST)
from warp_barriers import BRANCH, END, LABEL, compiled_ptx  # noqa: E402

ARCHITECTURE = "90a"
ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+"
                   r"(\S*hopper(?:Gemm|Persistent|Cluster)Kernel\S*)\(")
FENCE = re.compile(r"^\s*wgmma\.fence\b")
MMA = re.compile(r"^\s*wgmma\.mma_async\b")
COMMIT = re.compile(r"^\s*wgmma\.commit_group\b")
WAIT = re.compile(r"^\s*wgmma\.wait_group\S*\s+(\d+);")
# What needs every MMA finished: a stage handed back (to this block or, in version 4,
# through the cluster's window), a store of the accumulators (to C, or to version 4's
# staging buffers in shared memory).
NEEDS_RESULTS = re.compile(
    r"^\s*(?:@!?%\w+\s+)?(?:mbarrier\.arrive(?:\.\w+)*\.shared|st\.global|st\.shared)\b")

# A state is (the groups' state, whether a fence is waiting for the next group). The
# groups: no MMA outstanding, MMAs issued (a group open), groups committed.
IDLE, ISSUED, COMMITTED = "no MMA outstanding", "MMAs issued", "committed"
START = (IDLE, False)


def kernel_bodies(ptx, entries=ENTRY):
    """{entry name: its lines} for every kernel whose entry matches `entries` (every
    Hopper kernel): each entry's text up to the next entry (inline assembly's own
    braces rule out ending at the first '}')."""
    bodies = {}
    for part in re.split(r"(?m)^(?=\s*(?:\.visible\s+|\.weak\s+)?\.entry\s)", ptx):
        entry = entries.match(part)
        if entry:
            bodies[entry.group(1)] = part.splitlines()
    return bodies


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
    if END.match(line) and groups != IDLE:
        return state, f"the kernel ends while MMAs may still run ({groups})"
    return state, None


def order_problems_in(name, lines):
    """Every MMA-order problem on any path through this kernel, each as text."""
    labels = {match.group(1): i for i, line in enumerate(lines)
              for match in [LABEL.match(line)] if match}
    problems = [f"{name}: no {what} at all: not the kernel this check knows" for what, pattern in
                (("wgmma.mma_async", MMA), ("wgmma.fence", FENCE), ("wgmma.commit_group", COMMIT),
                 ("wgmma.wait_group", WAIT)) if not any(pattern.match(line) for line in lines)]
    if problems:
        return problems

    def successors(i):
        branch = BRANCH.match(lines[i])
        if branch:
            if branch.group(2) not in labels:
                problems.append(f"{name}: a branch to a label this check did not find: "
                                f"{lines[i].strip()}")
                return [i + 1] if branch.group(1) else []
            return ([i + 1] if branch.group(1) else []) + [labels[branch.group(2)]]
        if re.search(r"\b(?:bra|brx)\b", lines[i]):
            problems.append(f"{name}: a branch this check cannot read: {lines[i].strip()}")
        return [] if END.match(lines[i]) else [i + 1]

    arriving = {0: {START}}  # instruction -> the states it can be reached in
    pending = [0]
    while pending:
        i = pending.pop()
        if i >= len(lines):
            continue
        leaving = set()
        for state in arriving[i]:
            after, problem = step(state, lines[i])
            leaving.add(after)
            if problem:
                problems.append(f"{name}: {problem}")
        for following in successors(i):
            before = arriving.setdefault(following, set())
            if not leaving <= before:
                before |= leaving
                pending.append(following)
    return list(dict.fromkeys(problems))


def order_problems(folder):
    """Every problem in `folder`'s Hopper kernels; an empty list when there is none."""
    bodies = kernel_bodies(compiled_ptx(folder, ARCHITECTURE))
    problems = [] if bodies else [f"compute_{ARCHITECTURE}: no Hopper kernel in the PTX"]
    for name, lines in bodies.items():
        problems += [f"compute_{ARCHITECTURE} {problem}"
                     for problem in order_problems_in(name, lines)]
    print(f"compute_{ARCHITECTURE}: {len(bodies)} Hopper kernel(s) walked")
    return problems


def main():
    problems = order_problems(os.path.dirname(FAST))
    for problem in problems:
        print(problem)
    print("wgmma_order: " + (f"{len(problems)} problem(s)" if problems else
                             "every MMA fenced, committed and waited for "
                             "before its results are used"))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

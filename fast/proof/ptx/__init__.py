"""proof.ptx: what the two PTX walkers share. Each walker holds one rule:

    python -m proof.ptx.warp_barriers     version 1's and the lesson's epilogue barriers
    python -m proof.ptx.wgmma_order       the Hopper kernels' warpgroup MMAs in order

(from fast/; each needs nvcc, and no GPU). A rule that no run can be sure to show, a
missing barrier or fence, is still in the program's text: this module compiles the
sources to PTX (compiled_ptx), cuts out each kernel that a walker asks for
(kernel_bodies), follows every path through a kernel's branches and loops until the
states a walker tracks stop changing (follow_every_path), and runs a walker from the
command line (main): its problems printed, one line of verdict, exit status 1 where
there is any. A third walker, of version 4's stores of C through shared memory, left
with version 4 (fast/NOTES.md, "The versions").
"""

import os
import re
import subprocess
import sys
import tempfile

from proof import REPOSITORY

# The sources that hold the kernels, from the repository's top: fast/'s launcher, which
# includes every version the package holds, version 2's study, and the lesson's kernel.
LAUNCH_POLICY = os.path.join("fast", "csrc", "launch_policy.cu")
VERSION2_STUDY = os.path.join("fast", "studies", "version2_hopper.cu")
LESSON_KERNEL = "kernel.cu"

LABEL = re.compile(r"^(\$\w+):")
BRANCH = re.compile(r"^\s*(@!?%\w+\s+)?bra(?:\.uni)?\s+(\$\w+);")
END = re.compile(r"^\s*(?:ret|exit);")  # unpredicated: a path ends here


def nvcc():
    """CUDA_HOME's nvcc, else the one on PATH."""
    named = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return named if os.path.exists(named) else "nvcc"


def compiled_ptx(folder, architecture, sources):
    """The PTX of `folder`'s `sources` (paths from its top) for compute_`architecture`,
    as one text."""
    texts = []
    with tempfile.TemporaryDirectory(prefix="day87-ptx-") as scratch:
        for index, source in enumerate(sources):
            ptx_file = os.path.join(scratch, f"source{index}_{architecture}.ptx")
            subprocess.run([nvcc(), "-O3", "-ptx", f"-arch=compute_{architecture}", "-o",
                            ptx_file, os.path.join(folder, source)], check=True)
            with open(ptx_file) as file:
                texts.append(file.read())
    return "\n".join(texts)


def entry_named(kernel):
    """The pattern of a kernel's .entry line, for a regular expression of its names; its
    group 1 is the mangled name."""
    return re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+(\S*" + kernel + r"\S*)\(")


def kernel_bodies(ptx, entry):
    """{entry name: its lines} for every kernel whose .entry line matches `entry`: each
    entry's text up to the next entry. (Not up to its first '}' at a line's start: the
    Hopper kernels' inline assembly has braces of its own there.)"""
    bodies = {}
    for part in re.split(r"(?m)^(?=\s*(?:\.visible\s+|\.weak\s+)?\.entry\s)", ptx):
        found = entry.match(part)
        if found:
            bodies[found.group(1)] = part.splitlines()
    return bodies


def labels_in(lines):
    """{label: the index of its line}."""
    return {match.group(1): i for i, line in enumerate(lines)
            for match in [LABEL.match(line)] if match}


def follow_every_path(name, lines, start, first_states, transfer, region):
    """Every path through `lines` from `start`, branches and loops included: at each
    instruction, the set of states it can be reached in, from every way in, until
    nothing changes. transfer(i, states) gives the states that leave instruction i
    (and records whatever the walker finds there). A path ends at ret or exit. The
    problems of the walk itself, each as text: a branch whose target it cannot follow
    (a label not found, or one before `start`, outside `region`), or a branch it
    cannot read."""
    labels, problems = labels_in(lines), []

    def successors(i):
        branch = BRANCH.match(lines[i])
        if branch:
            target = labels.get(branch.group(2))
            if target is None or target < start:
                problems.append(f"{name}: a branch from {region} to "
                                + ("a label this check did not find" if target is None
                                   else f"before {region}")
                                + f", which it does not follow: {lines[i].strip()}")
                target = None
            following = [i + 1] if branch.group(1) else []  # a predicated branch may fall through
            return following + ([target] if target is not None else [])
        if re.search(r"\b(?:bra|brx)\b", lines[i]):  # a branch of a form BRANCH does not read
            problems.append(f"{name}: a branch this check cannot read: {lines[i].strip()}")
        return [] if END.match(lines[i]) else [i + 1]

    arriving = {start: set(first_states)}  # instruction -> the states it can be reached in
    pending = [start]
    while pending:
        i = pending.pop()
        if i >= len(lines):
            continue
        leaving = transfer(i, arriving[i])
        for following in successors(i):
            before = arriving.setdefault(following, set())
            if not leaving <= before:
                before |= leaving
                pending.append(following)
    return problems


def walk_kernels(folder, architectures, sources, entry, kind, problems_in):
    """Every problem that problems_in(name, lines) finds in each kernel whose .entry line
    matches `entry` (a `kind` of kernel), in `folder`'s `sources` compiled for each
    architecture, each problem led by its architecture; an empty list when there is
    none. No such kernel in the PTX is a problem too: then nothing was judged."""
    problems = []
    for architecture in architectures:
        bodies = kernel_bodies(compiled_ptx(folder, architecture, sources), entry)
        if not bodies:
            problems.append(f"compute_{architecture}: no {kind} in the PTX")
        for name, lines in bodies.items():
            problems += [f"compute_{architecture} {problem}"
                         for problem in problems_in(name, lines)]
        print(f"compute_{architecture}: {len(bodies)} {kind}(s) walked")
    return problems


def main(walker, find_problems, all_well, scope=""):
    """A walker's command line: find_problems(the repository), each problem printed,
    then `walker`'s verdict, the count or `all_well`, and `scope`; the exit status is 1
    where there is any problem."""
    problems = find_problems(REPOSITORY)
    for problem in problems:
        print(problem)
    print(f"{walker}: " + (f"{len(problems)} problem(s)" if problems else all_well) + scope)
    sys.exit(1 if problems else 0)

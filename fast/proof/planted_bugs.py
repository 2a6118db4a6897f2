"""planted_bugs.py: bugs planted in the fast tier's kernels, each seen caught. From fast/:

    python -m proof.planted_bugs             (needs a GPU and nvcc): version 1's bugs
    python -m proof.planted_bugs hopper      (a card of capability 9.0): the Hopper pipeline's,
                                             against the gate (version 3)
    python -m proof.planted_bugs study       (the same card): the same bugs, against version
                                             2's study
    python -m proof.planted_bugs PART "BUG"  PART wmma, hopper or study: its copy with no
                                             bug, and that one bug

Each planted bug is a text edit of one or more of fast/'s CUDA files, made in a copy of the
repository; an edit whose text a file no longer holds stops the run, naming the bug and
the file. (This is the one tool that edits source text: a planted bug is a mutation of the
real kernel, not a variant of it.) Three checks run on every copy: fast/proof/gate.cu
compiled for this machine's card, in its plain and its ordering build, and
proof/ptx/warp_barriers.py, which reads the compiled PTX; a fourth, compute-sanitizer's
racecheck on the plain gate (slow beside the others), runs on the copy with no bug and on
each bug that names it, where that gate built (in this part only). Each bug names the
checks that must fail on it; every other check must pass, and the copy with no bug must
pass them all. A check that could not run (a copy that does not build, a racecheck with
no summary) is never a catch: it is counted as a verdict not expected. The exit status is
the number of verdicts that were not the expected one. The programs build side by side.

The Hopper and study parts plant the same bugs in the Hopper pipeline, which version 3
(in the package) and version 2 (its study, fast/studies/version2_hopper.cu) hold alike,
so a bug there is planted in both files; one bug is in common.cuh's descriptors, which
both include, and one is version 3's own (the study must pass it). On every copy the
Hopper part runs the gate and the ordering gate built for sm_90a with --hopper (version
3's plans alone; the ordering build starts every stage as NaN, holds the producer before
each stage's first fill and each consumer before it multiplies a stage) and
proof/ptx/wgmma_order.py, which reads both files' PTX for fenced, committed and
waited-for MMAs; the study part runs version 2's study and its ordering build with
--no-timing (its checks alone, at the gate's Hopper shapes). Two parts, so that each runs
within ten minutes. A gate or study that runs past GATE_LIMIT_S (a pipeline that lost its
barriers' count can wait forever) has failed. compute-sanitizer's racecheck runs in the
Hopper part as a control, on the copy with no bug and on the consumer that does not
wait, at shapes up to 512: its hazard count is printed, and is no verdict either way,
because whether racecheck sees what TMA writes and wgmma reads is what the control is
for.

The bugs of the versions that left the package (4, 5 and the backward in one launch) left
with them; fast/NOTES.md keeps their verdicts, and git the commit that planted them.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import NamedTuple

import torch

from proof import REPOSITORY
from proof.ptx import nvcc
from proof.ptx.warp_barriers import missing_barriers
from proof.ptx.wgmma_order import order_problems

# The programs that run a copy's kernels, from the repository's top.
GATE_SOURCE = os.path.join("fast", "proof", "gate.cu")
STUDY_SOURCE = os.path.join("fast", "studies", "version2_hopper.cu")

GATE, ORDERING_GATE, WARP_BARRIERS, RACECHECK = (
    "gate", "ordering gate", "warp barriers", "racecheck")
STUDY, ORDERING_STUDY, WGMMA_ORDER = "study", "ordering study", "wgmma_order.py"
# The Hopper part's gates and studies, in both builds: a bug in the pipeline that version 3
# and version 2's study share must fail (or may, by timing) in both.
PLAIN, ORDERING = (GATE, STUDY), (ORDERING_GATE, ORDERING_STUDY)
# The time limit of the Hopper and study parts: the gate (the Hopper plans alone) and the
# study run in about 10 s each, and racecheck at shapes up to 512 in well under a minute.
# Version 1's part has none: its bugs cannot hang, and its racecheck of the whole gate
# takes minutes.
GATE_LIMIT_S = 30
HOPPER_RACECHECK_LIMIT_S = 60


class Bug(NamedTuple):
    files: tuple  # the files (from the repository's top) that every edit is made in
    edits: list  # (old text, new text)
    caught_by: tuple  # the checks that must fail on it; the others must pass
    # Checks that may catch it or not, by timing: the ordering build exists because
    # the plain gate sees an ordering bug only where a multiply happens to be slow.
    by_timing: tuple = ()
    sm_90_only: bool = False  # in the early-launched reduction, which older code does not have
    hopper: bool = False  # in the Hopper pipeline: the Hopper and study parts
    racecheck_control: bool = False  # racecheck's hazards printed, as a control, not a verdict


VERSION1, SCALE = ("fast/csrc/version1_wmma.cuh",), ("fast/csrc/backward_version1_scaled.cu",)
COMMON, VERSION3 = ("fast/csrc/common.cuh",), ("fast/csrc/version3_persistent.cuh",)
# Version 3 and version 2's study hold the same producer, consumers and epilogue: a bug
# there is in both.
HOPPER_PIPELINES = ("fast/studies/version2_hopper.cu", "fast/csrc/version3_persistent.cuh")


BUGS = {
    "no bug (the copy as it is)": Bug((), [], ()),
    "the last split's partial sum dropped": Bug(
        VERSION1, [("for (int split = 1; split < splits; ++split)",
                    "for (int split = 1; split < splits - 1; ++split)")],
        (GATE, ORDERING_GATE)),
    "the first split's partial sum added twice": Bug(
        VERSION1, [("        float4 sum = *reinterpret_cast<const float4*>(partials + i);\n",
          "        float4 sum = *reinterpret_cast<const float4*>(partials + i);\n"
          "        sum = make_float4(2 * sum.x, 2 * sum.y, 2 * sum.z, 2 * sum.w);\n")],
        (GATE, ORDERING_GATE)),
    "the early-launched reduction does not wait": Bug(
        VERSION1, [("    waitForPrerequisites();  // the multiply's partial sums are all written\n",
                    "")],
        (GATE, ORDERING_GATE), sm_90_only=True),
    "the reduction's first load issued before its wait": Bug(
        VERSION1, [("""    waitForPrerequisites();  // the multiply's partial sums are all written
    const size_t outputs = static_cast<size_t>(operands.m) * operands.n;
    for (size_t i = 4 * (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x); i < outputs;
         i += 4 * static_cast<size_t>(gridDim.x) * blockDim.x) {
        float4 sum = *reinterpret_cast<const float4*>(partials + i);
""", """    const size_t outputs = static_cast<size_t>(operands.m) * operands.n;
    const size_t first = 4 * (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x);
    const float4 first_sum =
        first < outputs ? *reinterpret_cast<const float4*>(partials + first)
                        : make_float4(0, 0, 0, 0);
    waitForPrerequisites();  // the multiply's partial sums are all written
    for (size_t i = first; i < outputs; i += 4 * static_cast<size_t>(gridDim.x) * blockDim.x) {
        float4 sum = i == first ? first_sum : *reinterpret_cast<const float4*>(partials + i);
""")],
        (ORDERING_GATE,), by_timing=(GATE,), sm_90_only=True),
    "the scale's cast does not wait at the grid barrier": Bug(
        SCALE, [("    cooperative::this_grid().sync();\n", "")],
        (ORDERING_GATE,), by_timing=(GATE,)),
    "the epilogue (the bias) applied per split": Bug(
        VERSION1, [("""\
            else  // one split's sums, in its own slice; splitSumKernel stores the total
                *reinterpret_cast<float4*>(partials +
                                           (blockIdx.y * static_cast<size_t>(m) + c_row) * n +
                                           first_c_col + col) = value;""",
          """            else {
                FastGemmOperands slice = operands;
                slice.c = partials + blockIdx.y * static_cast<size_t>(m) * n;
                storeOutputs(slice, c_row, first_c_col + col, value);
            }""")],
        (GATE, ORDERING_GATE)),
    # torch.cat([c1, c2], dim=1) hands c1 a gradient of row stride N1 + N2.
    "the scale reads a gradient with padded rows as dense": Bug(
        SCALE, [("col_stride == 1 && row_stride == cols &&",
                 "col_stride == 1 && row_stride >= cols &&")],
        (GATE, ORDERING_GATE)),
    # No gate's output shows these two (proof/ptx/warp_barriers.py says why), so the gates
    # must pass on them, and a gate that does see one is reported. racecheck, which
    # watches every lane's shared-memory accesses, and the PTX walk must fail.
    "the strip is overwritten before it is read out": Bug(
        VERSION1, [("        __syncwarp();  // the strip is read out before the next one "
                    "overwrites it\n", "")],
        (RACECHECK, WARP_BARRIERS)),
    "the strip is read out before it is stored": Bug(
        VERSION1, [("                                    wmma::mem_row_major);\n"
                    "        __syncwarp();\n",
          "                                    wmma::mem_row_major);\n")],
        (RACECHECK, WARP_BARRIERS)),
    # The Hopper kernels'. The first three, the bias and the last two fail a gate on
    # every run: the mbarrier bugs (the first two and the stage ahead) by a wrong
    # result (NaN or a refilled stage) or a hang, which the time limit turns into a
    # failure, in the ordering build; the three MMA-order bugs between are what no run
    # is sure to show, so the gates may catch them or not, and the PTX must.
    "a consumer does not wait for TMA to fill its stage": Bug(
        HOPPER_PIPELINES, [("        waitBarrier(&ring.full[stage], pass & 1);"
                            "  // TMA has written the whole stage\n", "")],
        ORDERING, by_timing=PLAIN, hopper=True, racecheck_control=True),
    "the producer does not wait for the consumers to empty a stage": Bug(
        HOPPER_PIPELINES, [("        waitBarrier(&ring.empty[stage], (pass & 1) ^ 1);"
                            "  // the consumers' last use of it is over\n",
          "")],
        ORDERING, by_timing=PLAIN, hopper=True),
    "the descriptors' swizzle (64-byte) differs from the tensor maps' (128-byte)": Bug(
        COMMON, [("static_cast<uint64_t>(stride_bytes >> 4) << 32 | 1ull << 62;",
          "static_cast<uint64_t>(stride_bytes >> 4) << 32 | 2ull << 62;")],
        PLAIN + ORDERING, hopper=True),
    "wgmma.fence only before the first stage's MMAs": Bug(
        HOPPER_PIPELINES, [("        mmaFence();\n", "        if (k_tile == 0) mmaFence();\n")],
        (WGMMA_ORDER,), by_timing=PLAIN + ORDERING, hopper=True),
    "wgmma.wait_group before wgmma.commit_group": Bug(
        HOPPER_PIPELINES, [("        mmaCommit();\n        mmaWait<0>();",
                            "        mmaWait<0>();\n        mmaCommit();")],
        (WGMMA_ORDER,), by_timing=PLAIN + ORDERING, hopper=True),
    "a stage handed back before its MMAs are waited for": Bug(
        HOPPER_PIPELINES, [("        mmaCommit();\n        mmaWait<0>();", "        mmaCommit();\n"
          "        if (threadIdx.x % 32 == 0) arrive(&ring.empty[stage]);\n        mmaWait<0>();"),
         ("        if (threadIdx.x % 32 == 0) arrive(&ring.empty[stage]);\n    }", "    }")],
        (WGMMA_ORDER,), by_timing=PLAIN + ORDERING, hopper=True),
    "the bias added at every stage of K": Bug(
        HOPPER_PIPELINES, [("                          : make_float2(0.0f, 0.0f);\n",
          "                          : make_float2(0.0f, 0.0f);\n"
          "        for (int j = 0; j < 16; ++j)\n"
          "            bias[j] = make_float2((operands.k + 63) / 64 * bias[j].x,\n"
          "                                  (operands.k + 63) / 64 * bias[j].y);\n")],
        PLAIN + ORDERING, hopper=True),
    # Two more. The producer waits for the stage before the one it refills: for the
    # use kStages + 1 positions back to be over, not kStages, so it may overwrite a
    # stage that a consumer is still multiplying (in the producer that both versions
    # share). And version 3's own: each block's walk over its tiles stops one tile
    # early (in the producer and the consumers alike, so nothing hangs: the tile is
    # simply never written, and C keeps the gate's NaN there); version 2's study, which
    # has no such walk, must pass.
    "the producer runs a stage ahead of its barrier": Bug(
        HOPPER_PIPELINES, [("        waitBarrier(&ring.empty[stage], (pass & 1) ^ 1);"
                            "  // the consumers' last use of it is over\n",
          "        waitBarrier(&ring.empty[(position + Plan::kStages - 1) % Plan::kStages],\n"
          "                    ((position - 1) / Plan::kStages & 1) ^ 1);\n")],
        ORDERING, by_timing=PLAIN, hopper=True),
    "the persistent loop skips each block's last tile": Bug(
        VERSION3, [("index < tiles; index += gridDim.x",
                    "index + gridDim.x < tiles; index += gridDim.x")],
        (GATE, ORDERING_GATE), hopper=True),
}

# Each bug goes into both builds of fast/proof/gate.cu (and, in the Hopper part, of version
# 2's study): the plain one, and the ordering build, in which every split holds before it
# writes its partial sums and the Hopper pipeline's fills and multiplies are held
# (gate_check.cuh says how), so that a missing wait is caught on every run rather than
# only where a kernel happens to be slow. check: (its program, its source, nvcc's flags).
ORDERING_FLAGS = ["-DDAY87_ORDERING_BUILD"]
PROGRAMS = {GATE: ("gate", GATE_SOURCE, []),
            ORDERING_GATE: ("gate_ordering", GATE_SOURCE, ORDERING_FLAGS),
            STUDY: ("version2_hopper", STUDY_SOURCE, []),
            ORDERING_STUDY: ("version2_hopper_ordering", STUDY_SOURCE, ORDERING_FLAGS)}


def copy_with_bug(folder, name, bug):
    """The repository (its work tree, not its history) copied into `folder`, with the
    bug's files edited."""
    shutil.copytree(REPOSITORY, folder, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    for file_name in bug.files:
        path = os.path.join(folder, file_name)
        with open(path) as file:
            text = file.read()
        for old, new in bug.edits:
            if old not in text:
                sys.exit(f"planted_bugs: {file_name} no longer has the text that '{name}' "
                         f"edits: {old.strip().splitlines()[0]!r}")
            text = text.replace(old, new)
        with open(path, "w") as file:
            file.write(text)


def verdict(bug, check, failed, reached):
    """What a check's result on a bug means, and whether it was the expected one."""
    if not reached:
        return (("passes: below sm_90 it is not reached", True) if not failed
                else ("fails: NOT AS EXPECTED", False))
    if check in bug.by_timing:
        return ("fails: caught" if failed
                else f"passes: timing decides here; {' and '.join(bug.caught_by)} "
                "must catch it"), True
    expected = check in bug.caught_by
    if failed == expected:
        return ("fails: caught" if failed else "passes, as it should"), True
    return f"{'fails' if failed else 'passes'}: NOT AS EXPECTED", False


def run_limited(command, folder, limit_s):
    """`command` run in `folder`: its CompletedProcess, or None where it ran past
    limit_s (None: no limit). It runs in a process group of its own
    (start_new_session), so that a kill reaches what it started too (racecheck's
    gate is its child); and since Ctrl-C then reaches this script alone, an
    interrupted run kills the group before it stops, leaving no gate spinning on
    the GPU."""
    process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None
    except BaseException:  # Ctrl-C, or anything else that stops this script
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_racecheck(folder, arguments=(), limit_s=None):
    """compute-sanitizer's racecheck on the plain gate in `folder`: (whether it
    reported a hazard, its summary line), or (None, why) where it gave no summary. A
    hazard, not the exit status, is what counts: the status is also 1 where the gate
    itself fails or the tool cannot start."""
    racecheck = run_limited(["compute-sanitizer", "--tool", "racecheck", "./gate", *arguments],
                            folder, limit_s)
    if racecheck is None:
        return None, f"no racecheck summary: still running after {limit_s} s, killed"
    summary = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed "
                        r"\((\d+) errors?, (\d+) warnings?\)", racecheck.stdout)
    if not summary:
        return None, (f"no racecheck summary (exit {racecheck.returncode}): "
                      f"{racecheck.stdout.strip()[-200:]}")
    return sum(int(count) for count in summary.groups()) > 0, summary.group(0)


def run_gate(folder, program, arguments, limit_s):
    """(whether the gate or study failed, what it said) for one program in `folder`; one
    past limit_s (None: no limit) has failed."""
    gate = run_limited([f"./{program}", *arguments], folder, limit_s)
    if gate is None:
        return True, f"still running after {limit_s} s: killed"
    failing = [line.strip() for line in gate.stdout.splitlines() if "FAIL" in line]
    return (gate.returncode != 0,
            f"{len(failing)} failing lines" + (f", e.g. {failing[0]}" if failing else ""))


def main(part, only=None):
    if not torch.cuda.is_available():
        sys.exit("planted_bugs.py needs a GPU to run the gates on; nothing was checked.")
    major, minor = torch.cuda.get_device_capability()
    hopper = part in ("hopper", "study")
    if hopper and (major, minor) != (9, 0):
        sys.exit(f"planted_bugs.py {part} needs a card of capability 9.0 "
                 f"(this one: {major}.{minor}), where the Hopper kernels run; "
                 "nothing was checked.")
    # The Hopper and study parts' programs hold sm_90a code (the only code with the kernels'
    # bodies): the gate checks version 3's plans alone, the study version 2's without
    # timing them. Version 1's part builds the gate for the card's own architecture, and
    # runs it whole.
    architecture = "90a" if hopper else f"{major}{minor}"
    checks = [STUDY, ORDERING_STUDY] if part == "study" else [GATE, ORDERING_GATE]
    arguments = {GATE: ["--hopper"] if hopper else [], STUDY: ["--no-timing"]}
    arguments[ORDERING_GATE], arguments[ORDERING_STUDY] = arguments[GATE], arguments[STUDY]
    limit_s = GATE_LIMIT_S if hopper else None
    bugs = {name: bug for name, bug in BUGS.items()
            if (bug.hopper == hopper and only in (None, name)) or not bug.edits}
    if only is not None and only not in bugs:
        sys.exit(f"planted_bugs: the {part} part has no bug named {only!r}")
    with tempfile.TemporaryDirectory(prefix="day87-planted-") as scratch:
        folders, builds = {}, {}
        for index, (name, bug) in enumerate(bugs.items()):
            folders[name] = os.path.join(scratch, f"bug{index}")
            copy_with_bug(folders[name], name, bug)
            for check in checks:
                program, source, flags = PROGRAMS[check]
                builds[name, check] = subprocess.Popen(
                    [nvcc(), "-O3", "-gencode",
                     f"arch=compute_{architecture},code=sm_{architecture}", *flags,
                     "-o", program, source], cwd=folders[name])
        unexpected = 0
        for name, bug in bugs.items():  # the PTX is read while the programs build
            reached = not bug.sm_90_only or major >= 9
            # check -> (whether it failed, what it said); None where it could not run,
            # which is never a catch: a planted edit that breaks the build proves nothing.
            results = {}
            static_checks = ({WGMMA_ORDER: order_problems} if part == "hopper"
                             else {} if part == "study" else {WARP_BARRIERS: missing_barriers})
            for static_check, read_ptx in static_checks.items():
                try:
                    problems = read_ptx(folders[name])
                    results[static_check] = (bool(problems),
                                             problems[0].splitlines()[0] if problems else "")
                except subprocess.CalledProcessError as error:
                    results[static_check] = (
                        None, f"nvcc could not compile the copy to PTX (exit {error.returncode})")
            for check in checks:
                program = PROGRAMS[check][0]
                if builds[name, check].wait() != 0:
                    results[check] = (None, f"the {program} did not build")
                    continue
                results[check] = run_gate(folders[name], program, arguments[check], limit_s)
            if ((RACECHECK in bug.caught_by or not bug.edits) and not hopper
                    and results[GATE][0] is not None):
                results[RACECHECK] = run_racecheck(folders[name])
            for check, (failed, detail) in results.items():
                if failed is None:
                    meaning, as_expected = "could not run: NOT AS EXPECTED", False
                else:
                    meaning, as_expected = verdict(
                        bug, check, failed, reached or check in (WARP_BARRIERS, WGMMA_ORDER))
                unexpected += not as_expected
                print(f"{name:<54} {check:<14} {meaning}" + (f"; {detail}" if detail else ""),
                      flush=True)
            if (part == "hopper" and (bug.racecheck_control or not bug.edits)
                    and results[GATE][0] is not None):
                _, summary = run_racecheck(folders[name], arguments[GATE] + ["--small"],
                                           HOPPER_RACECHECK_LIMIT_S)
                print(f"{name:<54} {'racecheck':<14} control, not a verdict: {summary}", flush=True)
    print(f"planted_bugs: {unexpected} unexpected verdict(s)")
    sys.exit(unexpected)


if __name__ == "__main__":
    if len(sys.argv) > 3 or sys.argv[1:2] not in ([], ["wmma"], ["hopper"], ["study"]):
        sys.exit("usage: python -m proof.planted_bugs [wmma | hopper | study] [BUG]  (from fast/)")
    main(sys.argv[1] if sys.argv[1:] else "wmma", sys.argv[2] if sys.argv[2:] else None)

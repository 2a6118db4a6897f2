"""planted_bugs.py: the fast tier's split-K path's checks and the scale's barrier, seen failing.

    python fast/planted_bugs.py            (needs a GPU and nvcc)

Each planted bug is a text edit of fast/kernel.cu, made in a copy of the repository
(so that the lesson's kernel.cu, which fast/kernel.cu includes, is beside it), and
compiled into fast/gate.cu for this machine's card, in its plain and its ordering
build. Each gate must pass on the copy as it is and fail on every bug it reaches (on
a card older than sm_90 it does not reach a bug in the early launch); the exit
status is the number of verdicts that were not the expected one. The builds run
side by side.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import torch

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: the (old, new) edits of fast/kernel.cu. The first is no bug at all.
BUGS = {
    "no bug (the copy as it is)": [],
    "the last split's partial sum dropped": [
        ("for (int split = 1; split < splits; ++split)", "for (int split = 1; split < splits - 1; ++split)")],
    "the first split's partial sum added twice": [
        ("        float4 sum = *reinterpret_cast<const float4*>(partials + i);\n",
         "        float4 sum = *reinterpret_cast<const float4*>(partials + i);\n"
         "        sum = make_float4(2 * sum.x, 2 * sum.y, 2 * sum.z, 2 * sum.w);\n")],
    # sm_90 and newer only: below, the reduction is launched in plain stream order.
    "sm_90: the early-launched reduction does not wait": [
        ("    waitForPrerequisites();  // the multiply's partial sums are all written\n", "")],
    # Caught for certain only by the ordering build: in the plain one, whether a block
    # reads another's largest magnitude before it is written is timing.
    "the scale's cast does not wait at the grid barrier": [
        ("    cooperative::this_grid().sync();\n", "")],
    "the epilogue (the bias) applied per split": [
        ("""            else  // one split's sums, in its own slice; splitSumKernel stores the total
                *reinterpret_cast<float4*>(partials + (blockIdx.y * static_cast<size_t>(m) + c_row) * n +
                                           first_c_col + col) = value;""",
         """            else {
                GemmOperands slice = operands;
                slice.c = partials + blockIdx.y * static_cast<size_t>(m) * n;
                storeOutputs(slice, c_row, first_c_col + col, value);
            }""")],
}


# Each bug goes into both of fast/gate.cu's builds: the plain one, and the ordering
# build, in which every split holds before it writes its partial sums (fast/gate.cu
# says how), so that a missing wait is caught on every split shape rather than only
# where the multiply happens to be slow.
GATES = {"gate": [], "gate_ordering": ["-DDAY87_ORDERING_BUILD"]}
# The bugs that the plain gate may pass by timing, as the comment above them says.
ORDERING_ONLY = {"the scale's cast does not wait at the grid barrier"}


def copy_with_bug(folder, name, edits):
    """The repository (its work tree, not its history) copied into `folder`, with
    fast/kernel.cu edited."""
    shutil.copytree(REPOSITORY, folder, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    kernel = os.path.join(folder, "fast", "kernel.cu")
    with open(kernel) as file:
        text = file.read()
    for old, new in edits:
        if old not in text:
            sys.exit(f"planted_bugs: fast/kernel.cu no longer has the text that '{name}' edits")
        text = text.replace(old, new)
    with open(kernel, "w") as file:
        file.write(text)


def main():
    if not torch.cuda.is_available():
        sys.exit("planted_bugs.py needs a GPU to run the gates on; nothing was checked.")
    major, minor = torch.cuda.get_device_capability()
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc = nvcc if os.path.exists(nvcc) else "nvcc"
    with tempfile.TemporaryDirectory(prefix="day87-planted-") as scratch:
        builds = {}
        for index, (name, edits) in enumerate(BUGS.items()):
            folder = os.path.join(scratch, f"bug{index}")
            copy_with_bug(folder, name, edits)
            for gate_name, flags in GATES.items():
                builds[name, gate_name] = (folder, subprocess.Popen(
                    [nvcc, "-O3", "-gencode", f"arch=compute_{major}{minor},code=sm_{major}{minor}", *flags,
                     "-o", gate_name, os.path.join("fast", "gate.cu")], cwd=folder))
        unexpected = 0
        for (name, gate_name), (folder, build) in builds.items():
            if build.wait() != 0:
                print(f"{name}: the {gate_name} did not build")
                unexpected += 1
                continue
            gate = subprocess.run([f"./{gate_name}"], cwd=folder, capture_output=True, text=True)
            failed = [line for line in gate.stdout.splitlines() if "FAIL" in line]
            reached = not name.startswith("sm_90:") or major >= 9
            expected_to_fail = bool(BUGS[name]) and reached
            timing = name in ORDERING_ONLY and gate_name == "gate"
            verdict = "caught" if gate.returncode and expected_to_fail else (
                "passes: only the ordering build is sure to catch it" if timing else
                "NOT AS EXPECTED" if gate.returncode or expected_to_fail else
                "passes, as it should" if reached else "passes: below sm_90 it is not reached")
            unexpected += verdict == "NOT AS EXPECTED"
            print(f"{name:<50} {gate_name:<13} exit {gate.returncode}: {verdict}; {len(failed)} failing lines"
                  + (f", e.g. {failed[0].strip()}" if failed else ""))
    print(f"planted_bugs: {unexpected} unexpected verdict(s)")
    sys.exit(unexpected)


if __name__ == "__main__":
    main()

"""same_kernels.py: whether fast/'s kernels compile to the code they compiled to at a commit.
From fast/:

    python -m proof.same_kernels COMMIT                  (nvcc and git; no GPU)
    python -m proof.same_kernels COMMIT --removed NAME   NAME (a kernel, as printed) is
                                                         meant to be gone since COMMIT
    python -m proof.same_kernels COMMIT --added NAME     NAME is meant to be new since it

A change that only moves source (between files, into a namespace, across lines) must
leave every kernel as it was. For sm_75, sm_80 and sm_90a this compiles the library's
CUDA sources of COMMIT (`git archive`) and of the working tree, each to cubins as
day87_fast's build does (-O3, one cubin per source; the library's sources are the .cu
files under fast/ without a main()), and compares kernel by kernel:
  - the SASS instructions: nvdisasm's count where nvdisasm is found (on PATH, in
    $NVDISASM or in the toolkit: pip's nvidia-cuda-nvdisasm has one), else the size
    of the kernel's .text section in 16-byte instructions, padding included;
  - the registers ptxas gave it (ptxas -v);
  - whether its .text section holds the same bytes.
Kernels are matched by name and template arguments, namespaces dropped. The exit
status is 1 where a count differs or a kernel is on one side only (but a --removed
one, which must be gone, or an --added one, which must be new); a difference in bytes
alone is printed, not failed (a shared-memory offset or an address moves the bytes,
not the instructions).

First it prints each of the commit's sources beside the one that holds it now: the
same path, or the one MOVED gives it (a file moved since, or renamed). A source of
the commit with none now, or one now that is no source's counterpart, is printed
too; its kernels are then on one side only, and only --removed or --added passes
them.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

from proof import REPOSITORY

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
NVCC = os.path.join(CUDA_HOME, "bin", "nvcc")
ARCHITECTURES = ["sm_75", "sm_80", "sm_90a"]
# Where a library source of an earlier commit is now, from the repository's top. Issue
# 61 laid fast/ out by role: the kernels went into fast/csrc/, and the backward's files
# were named as versions, like the forward's. (The backward in one launch has left the
# package since: its kernel is one to name --removed.)
MOVED = {
    "fast/launch_policy.cu": "fast/csrc/launch_policy.cu",
    "fast/scale_to_half.cu": "fast/csrc/backward_version1_scaled.cu",
}


def nvdisasm():
    candidates = [os.environ.get("NVDISASM"), shutil.which("nvdisasm"),
                  os.path.join(CUDA_HOME, "bin", "nvdisasm")]
    return next((path for path in candidates if path and os.path.exists(path)), None)


def text_sections(cubin):
    """{section name: (bytes)} of the cubin's .text.* sections (an ELF64 file)."""
    with open(cubin, "rb") as file:
        data = file.read()
    section_table, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)

    def header(index):  # name offset, offset in the file, size
        fields = struct.unpack_from("<IIQQQQIIQQ", data, section_table + index * entry_size)
        return fields[0], fields[4], fields[5]

    _, names_at, _ = header(names_index)
    sections = {}
    for index in range(count):
        name_offset, offset, size = header(index)
        name = data[names_at + name_offset:data.index(b"\0", names_at + name_offset)].decode()
        if name.startswith(".text."):
            sections[name[len(".text."):]] = data[offset:offset + size]
    return sections


def instruction_counts(cubin, disassembler):
    """{mangled kernel name: SASS instructions}."""
    if disassembler is None:
        return {name: len(code) // 16 for name, code in text_sections(cubin).items()}
    listing = subprocess.run([disassembler, cubin], capture_output=True, text=True,
                             check=True).stdout
    counts, current = {}, None
    for line in listing.splitlines():
        section = re.match(r"\s*\.text\.(\S+):", line)
        if section:
            current = section.group(1)
            counts[current] = 0
        elif current and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            counts[current] += 1
    return counts


def readable(mangled):
    """A kernel's name and template arguments, namespaces and parameters dropped."""
    name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    name = re.sub(r"^void ", "", name)
    name = name[:name.rindex("(")] if name.endswith(")") else name
    return re.sub(r"\b\w+::", "", name)


def library_sources(folder):
    """The library's CUDA sources in `folder`, as paths from its top: the .cu files under
    fast/ that hold no main() (gate.cu, tile_order.cu and the studies are programs of their
    own)."""
    paths = sorted(glob.glob(os.path.join(folder, "fast", "**", "*.cu"), recursive=True))
    return [os.path.relpath(path, folder) for path in paths
            if not re.search(r"^int main\(", open(path).read(), re.MULTILINE)]


def print_counterparts(then, now, commit):
    """Each of the commit's sources beside the one that holds it now (MOVED), and any
    source on one side only."""
    print(f"sources: at {commit} -> now")
    for path in then:
        counterpart = MOVED.get(path, path)
        print(f"  {path} -> " + (counterpart if counterpart in now
                                 else "NONE (its kernels must be named --removed)"))
    counterparts = {MOVED.get(path, path) for path in then}
    for path in now:
        if path not in counterparts:
            print(f"  NONE -> {path} (its kernels must be named --added)")


def compile_source(folder, source, architecture, scratch):
    """(the cubin's path, {mangled kernel: registers}) for one source and architecture."""
    cubin = os.path.join(scratch, f"{source.replace(os.sep, '_')}.{architecture}.cubin")
    target = f"arch=compute_{architecture[3:]},code={architecture}"
    result = subprocess.run([NVCC, "-O3", "-cubin", "-gencode", target, "-Xptxas", "-v",
                             "-o", cubin, os.path.join(folder, source)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"same_kernels: {source} did not compile for {architecture}:\n"
                 f"{result.stderr[-2000:]}")
    registers, entry = {}, None
    for line in result.stderr.splitlines():
        compiling = re.search(r"Compiling entry function '(\S+)'", line)
        used = re.search(r"Used (\d+) registers", line)
        if compiling:
            entry = compiling.group(1)
        elif used and entry:
            registers[entry] = int(used.group(1))
            entry = None
    return cubin, registers


def start_builds(folder, sources, scratch, compiler):
    """{(architecture, source): its build, started on `compiler` (an executor, which runs
    as many side by side as there are cores)}, for every architecture."""
    os.makedirs(scratch)
    return {(architecture, source): compiler.submit(compile_source, folder, source, architecture,
                                                    scratch)
            for architecture in ARCHITECTURES for source in sources}


def compiled_kernels(builds, architecture, disassembler):
    """{kernel: (instructions, registers, .text bytes)} of one side's builds for one
    architecture, each build waited for."""
    kernels = {}
    for (built_for, source), build in builds.items():
        if built_for != architecture:
            continue
        cubin, registers = build.result()
        sections = text_sections(cubin)
        for mangled, instructions in instruction_counts(cubin, disassembler).items():
            name = readable(mangled)
            # A count that cannot be compared, or two kernels under one name, is no verdict.
            if mangled not in registers or name in kernels:
                sys.exit(f"same_kernels: {mangled} in {source} for {architecture}: "
                         + ("a second kernel named " + name if name in kernels
                            else "ptxas -v printed no registers for it"))
            kernels[name] = (instructions, registers[mangled], sections[mangled])
    return kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", help="the commit whose kernels the working tree's must equal")
    parser.add_argument("--removed", action="append", default=[], metavar="KERNEL",
                        help="a kernel meant to be gone since the commit (repeatable)")
    parser.add_argument("--added", action="append", default=[], metavar="KERNEL",
                        help="a kernel meant to be new since the commit (repeatable)")
    arguments = parser.parse_args()
    commit = arguments.commit
    disassembler = nvdisasm()
    named = {kernel: set() for kernel in arguments.removed + arguments.added}  # where seen
    print(f"instructions counted by {disassembler or 'the .text sections (16 bytes each)'}; "
          + subprocess.run([NVCC, "--version"], capture_output=True,
                           text=True).stdout.split()[-1])
    differences = 0
    with tempfile.TemporaryDirectory() as scratch, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as compiler:
        baseline = os.path.join(scratch, "baseline")
        os.makedirs(baseline)
        archive = subprocess.run(["git", "-C", REPOSITORY, "archive", commit], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", baseline], input=archive, check=True)
        sources_then, sources_now = library_sources(baseline), library_sources(REPOSITORY)
        print_counterparts(sources_then, sources_now, commit)
        builds_then = start_builds(baseline, sources_then, os.path.join(scratch, "then"),
                                   compiler)
        builds_now = start_builds(REPOSITORY, sources_now, os.path.join(scratch, "now"),
                                  compiler)
        for architecture in ARCHITECTURES:
            then = compiled_kernels(builds_then, architecture, disassembler)
            now = compiled_kernels(builds_now, architecture, disassembler)
            print(f"\n{architecture}: {'kernel':<58}{commit:>18}{'now':>18}  same bytes")
            for kernel in sorted(set(then) | set(now)):
                before, after = then.get(kernel), now.get(kernel)
                counts = [f"{side[0]} / {side[1]} reg" if side else "missing"
                          for side in (before, after)]
                same = before is not None and after is not None and before[:2] == after[:2]
                removed = kernel in arguments.removed and after is None
                added = kernel in arguments.added and before is None
                # named gone or new, and still there or there before
                not_as_named = kernel in named and not (removed or added)
                if kernel in named:
                    named[kernel].add(architecture)
                differences += not (same or removed or added) or not_as_named
                bytes_alike = ("-" if removed or added
                               else "yes" if same and before[2] == after[2] else "no")
                verdict = ("   NOT GONE OR NEW, as named" if not_as_named else "" if same
                           else "   removed, as meant" if removed
                           else "   added, as meant" if added else "   DIFFERS")
                print(f"{' ' * len(architecture)}  {kernel:<58}{counts[0]:>18}{counts[1]:>18}  "
                      f"{bytes_alike}{verdict}")
    # A name given that no architecture's kernels hold is a typo, not a kernel gone or new.
    unknown = sorted(kernel for kernel, architectures in named.items() if not architectures)
    for kernel in unknown:
        print(f"same_kernels: no kernel named {kernel!r} on either side")
    print(f"\nsame_kernels: {differences} kernel(s) differ" if differences else
          "\nsame_kernels: every kernel on both sides has the same instruction count and "
          "registers" + (" (and those named are gone or new, as meant)" if named else ""))
    sys.exit(1 if differences or unknown else 0)


if __name__ == "__main__":
    main()

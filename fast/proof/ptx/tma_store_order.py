"""tma_store_order.py: version 4's stores of C through shared memory, in order, read
from the compiled program.

    python -m proof.ptx.tma_store_order    (from fast/; needs nvcc, no GPU)

Version 4 (fast/csrc/version4_cluster.cuh, storeTile) writes C into staging buffers in
shared memory with ordinary stores (st.shared) and has TMA copy each buffer out
(cp.async.bulk.tensor, global from shared::cta). TMA reads the buffer after the
instruction that issues it, through the async proxy, and two orders keep it right;
neither is a matter of a run's timing that a gate could be sure to see:
  - before a store is issued, the buffer's writes are shown to the async proxy
    (fence.proxy.async.shared::cta) and every writing thread has reached a bar.sync
    after that fence;
  - before a buffer is written again, the store that last read it has read it:
    cp.async.bulk.wait_group.read N, with N below the number of buffers
    (kStoreBuffers, read from the header), and a bar.sync after it that tells the
    other threads;
and the kernel ends only after cp.async.bulk.wait_group 0, its stores written.
The check reads the PTX of fast/csrc/launch_policy.cu for compute_90a (as
wgmma_order.py does) and walks each hopperClusterKernel in text order: storeTile's
loop over the sub-tiles is unrolled, and its first sub-tile's wait stands before its
writes, so the text holds every store's order, the loop's wrap from one tile to the
next included. What it does not see: which thread runs an instruction. A bulk store's
group belongs to the thread that issued it, so a wait run by another thread would
pass here and order nothing; storeTile issues and waits in one thread, `issuer`.
It exits 0 when every kernel's stores are in order, 1 otherwise.
"""

import os
import re
import sys

from proof import ptx

ARCHITECTURE = "90a"
ENTRY = ptx.entry_named("hopperClusterKernel")
VERSION4 = os.path.join("fast", "csrc", "version4_cluster.cuh")
GUARD = r"^\s*(?:@!?%\w+\s+)?"  # an instruction's optional predicate
STAGING_WRITE = re.compile(GUARD + r"st\.shared\b")
FENCE = re.compile(GUARD + r"fence\.proxy\.async\.shared::cta\b")
BARRIER = re.compile(GUARD + r"bar(?:rier)?\.sync\b")
STORE = re.compile(GUARD + r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta\b")
COMMIT = re.compile(GUARD + r"cp\.async\.bulk\.commit_group\b")
READ_WAIT = re.compile(GUARD + r"cp\.async\.bulk\.wait_group\.read\s+(\d+);")
WRITE_WAIT = re.compile(GUARD + r"cp\.async\.bulk\.wait_group\s+(\d+);")
# An end, predicated or not: the text is read in order, not path by path, so an exit
# that may run is one where the stores must be written.
END = re.compile(GUARD + r"(?:ret|exit);")


def staging_buffers(folder):
    """kStoreBuffers, as version4_cluster.cuh states it."""
    with open(os.path.join(folder, VERSION4)) as file:
        found = re.search(r"\bkStoreBuffers\s*=\s*(\d+)", file.read())
    if not found:
        sys.exit("tma_store_order: version4_cluster.cuh no longer states kStoreBuffers")
    return int(found.group(1))


def store_problems_in(name, lines, buffers):
    """Every store-order problem in this kernel's text, each as text."""
    problems = [f"{name}: no {what} at all: not the kernel this check knows"
                for what, pattern in (("TMA store", STORE), ("cp.async.bulk.commit_group", COMMIT))
                if not any(pattern.match(line) for line in lines)]
    if problems:
        return problems
    read_waited = met_after_wait = False  # since the last commit
    writes = fenced = met_after_fence = False  # since the last store
    stores_written = True  # no store left unwaited for
    for line in lines:
        wait = READ_WAIT.match(line)
        if wait:
            if int(wait.group(1)) >= buffers:
                problems.append(f"{name}: cp.async.bulk.wait_group.read {wait.group(1)} with "
                                f"{buffers} staging buffers: it lets the store that last read "
                                "a buffer still read it")
            read_waited, met_after_wait = True, False
        elif BARRIER.match(line):
            met_after_wait |= read_waited
            met_after_fence |= fenced
        elif STAGING_WRITE.match(line):
            if not (read_waited and met_after_wait):
                problems.append(f"{name}: a staging buffer written with no "
                                "cp.async.bulk.wait_group.read and bar.sync after the last "
                                "store (it may still be reading it)")
            writes, fenced, met_after_fence = True, False, False
        elif FENCE.match(line):
            fenced |= writes
        elif STORE.match(line):
            if not (writes and fenced and met_after_fence):
                problems.append(f"{name}: a TMA store issued with the staging writes not "
                                "fenced (fence.proxy.async.shared::cta) and then met at bar.sync")
            writes = fenced = met_after_fence = False
            stores_written = False
        elif COMMIT.match(line):
            read_waited = met_after_wait = False
        elif (written := WRITE_WAIT.match(line)) and written.group(1) == "0":
            stores_written = True
        elif END.match(line) and not stores_written:
            problems.append(f"{name}: the kernel ends with TMA stores not waited for "
                            "(cp.async.bulk.wait_group 0)")
    return list(dict.fromkeys(problems))


def store_problems(folder):
    """Every problem in `folder`'s version 4 kernels; an empty list when there is none."""
    buffers = staging_buffers(folder)
    return ptx.walk_kernels(folder, [ARCHITECTURE], [ptx.LAUNCH_POLICY], ENTRY,
                            "hopperClusterKernel",
                            lambda name, lines: store_problems_in(name, lines, buffers))


if __name__ == "__main__":
    ptx.main("tma_store_order", store_problems,
             "every staging buffer fenced before its store, and waited for before it is "
             "written again")

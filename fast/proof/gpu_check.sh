#!/usr/bin/env bash
# fast/proof/gpu_check.sh: every GPU-side check of the fast tier (fast/), on one machine,
# in ten parts that each run on their own, each within ten minutes.
#
#   bash fast/proof/gpu_check.sh wheel OUT      # the wheel under this machine's torch:
#                                               # imported from outside the tree, the
#                                               # table chosen and forced to each kernel,
#                                               # each switch's value taken or refused by
#                                               # name (tests/switches.py), the lesson's
#                                               # table beside it
#   bash fast/proof/gpu_check.sh gate OUT       # proof/gate.cu and its ordering build,
#                                               # compute-sanitizer on the gate and on the
#                                               # operators through torch, the warp
#                                               # barriers in the PTX, the lesson's table
#                                               # against day87_fast (tests/test_fast.py),
#                                               # its self-test (proof/self_test_fast.py),
#                                               # which plan ran, ncu on the forward
#   bash fast/proof/gpu_check.sh gate-bugs OUT  # version 1's and the scaled backward's
#                                               # planted bugs, which the gate's checks
#                                               # must catch (proof/planted_bugs.py)
#   bash fast/proof/gpu_check.sh bench OUT      # bench/bench.py: every table, day 88's
#                                               # included
#   bash fast/proof/gpu_check.sh forward OUT    # the tile plans: the gate for sm_90a and
#                                               # compute_75, the sm_75 cubin's registers,
#                                               # every forward variant timed
#   bash fast/proof/gpu_check.sh compute75 OUT  # the T4's code path, compute_75 PTX that
#                                               # the driver compiles for this card: the
#                                               # gate and compute-sanitizer, the table,
#                                               # which plan ran, the plans among the
#                                               # variants
#   bash fast/proof/gpu_check.sh hopper OUT     # version 3 (an H100 or H200): the gate for
#                                               # sm_90a, its launcher chosen and forced to
#                                               # it, its ordering build, memcheck,
#                                               # racecheck and synccheck at shapes up to
#                                               # 512, wgmma_order, the tile order timed
#   bash fast/proof/gpu_check.sh hopper-bugs OUT  # the Hopper pipeline's planted bugs
#                                               # (the same card), against the gate's
#                                               # version 3 and wgmma_order
#   bash fast/proof/gpu_check.sh studies OUT    # each study in fast/studies/ (the same
#                                               # card): built, its checks and its times,
#                                               # its ordering build, memcheck and
#                                               # synccheck at shapes up to 512, the
#                                               # Hopper pipeline's planted bugs against
#                                               # version 2's study
#   bash fast/proof/gpu_check.sh hopper-tables OUT  # the wheel as a user installs it:
#                                               # HGMMA in its SASS, the table forced to
#                                               # each kernel and chosen, and built for
#                                               # 7.5+PTX (the T4's code); bench.py's
#                                               # forward table
#
# Run it from anywhere. OUT is taken from the lesson's folder (fast/..), as
# checks/gpu_check.sh takes it, and the checks run in fast/, where its tools run as
# modules (python3 -m proof.planted_bugs). Each step's output goes to the console and
# to OUT/PART.log; the exit status is the number of steps that failed.
#
# The package under test, in the parts that call it (wheel, gate, bench, forward,
# hopper-tables): the wheel that DAY87_FAST_WHEEL names (one built elsewhere, carried),
# else one built here from fast/ (setup.py); either installed into a folder of its own,
# first on PYTHONPATH. The other parts build what they run with nvcc.
set -u
part=${1:-}
out=${2:-}
parts="wheel|gate|gate-bugs|bench|forward|compute75|hopper|hopper-bugs|studies|hopper-tables"
case "|$parts|" in
    *"|$part|"*)
        [ -n "$out" ] || { echo "usage: bash fast/proof/gpu_check.sh $part OUT" >&2; exit 2; }
        ;;
    *)
        echo "usage: bash fast/proof/gpu_check.sh $parts OUT" >&2
        exit 2
        ;;
esac
cd "$(dirname "$0")/../.."   # the lesson's folder, where OUT is taken from
# OUT and its log, step, and the provenance step: shared with checks/gpu_check.sh
source checks/gpu_check_steps.sh
cd fast   # where fast/'s tools run, as modules

# install_package FOLDER [ARCHITECTURES]: day87_fast into FOLDER, put first on PYTHONPATH:
# DAY87_FAST_WHEEL's wheel, or, where ARCHITECTURES are named or no wheel is, built here for
# them (pip runs fast/setup.py; CXX as setup.py chooses it).
install_package() {
    local folder=$1 architectures=${2-}
    rm -rf "$folder"
    if [ -z "$architectures" ] && [ -n "${DAY87_FAST_WHEEL-}" ]; then
        step install-wheel python3 -m pip install -q --no-index --no-deps --target "$folder" \
            "$DAY87_FAST_WHEEL"
    else
        step build-and-install env ${architectures:+TORCH_CUDA_ARCH_LIST=$architectures} \
            python3 -m pip install -q --no-build-isolation --no-index --no-deps \
            --target "$folder" .
    fi
    export PYTHONPATH="$folder${PYTHONPATH:+:$PYTHONPATH}"
}
site=/tmp/day87-fast-site   # outside OUT: only logs come back
case "$part" in
    wheel | gate | bench | forward | hopper-tables) install_package "$site" ;;
esac

# Which kernel and tile plan day87_fast::wmma_mm ran at the lesson's first shape, by the
# kernel's name in the profiler; it fails unless the name holds EXPECTED_PLAN.
plan_run='import os
import torch, day87_fast
a = torch.randn(256, 384, dtype=torch.half, device="cuda")
b = torch.randn(384, 512, dtype=torch.half, device="cuda")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
    day87_fast.wmma_mm(a, b)
    torch.cuda.synchronize()
names = sorted({event.name for event in profile.events() if "tuned::" in event.name})
print("kernels run:", names)
assert any(os.environ["EXPECTED_PLAN"] in name for name in names), '
plan_run+='"expected " + os.environ["EXPECTED_PLAN"]'

# The operators through torch, for compute-sanitizer: the forward (K split on a large
# card), the forward with a bias, both backwards, and a K of 48 (a tail stage).
driver='import torch, day87_fast
a = torch.randn(256, 384, dtype=torch.half, device="cuda", requires_grad=True)
b = torch.randn(384, 512, dtype=torch.half, device="cuda", requires_grad=True)
bias = torch.randn(512, device="cuda", requires_grad=True)
day87_fast.wmma_mm(a, b).sum().backward()
day87_fast.wmma_mm_bias(a, b, bias).sum().backward()
day87_fast.wmma_mm(torch.randn(128, 48, dtype=torch.half, device="cuda"), '
driver+='torch.randn(48, 256, dtype=torch.half, device="cuda"))
torch.cuda.synchronize()
print("driver: wmma_mm and wmma_mm_bias, forward and backward, done")'

if [ "$part" = wheel ]; then
    # From outside the tree: the installed package, its library, what it was built for.
    step import-outside bash -c 'cd / && python3 -c "import day87_fast, torch
print(day87_fast.__file__); print(day87_fast.BUILD); print(\"torch\", torch.__version__)"'
    step table python3 -m tests.test_fast
    for kernel in wmma persistent; do
        step "table-$kernel" env DAY87_FAST_KERNEL=$kernel python3 -m tests.test_fast
    done
    # Each value of DAY87_FAST_KERNEL and DAY87_FAST_BACKWARD through the package: what
    # ships runs, and a version that is a study now, or left, is refused by name.
    step switches python3 -m tests.switches
    step lesson-table bash -c "cd .. && python3 test_op.py"
fi

if [ "$part" = gate ]; then
    arch=$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}{n}')")
    step gate-build nvcc -O3 -lineinfo -gencode "arch=compute_$arch,code=sm_$arch" \
        -o "$out/gate" proof/gate.cu
    step gate "$out/gate"
    # The ordering build: every split holds before writing its partial sums, and the
    # scale's block 0 before writing its largest magnitude (proof/gate.cu says why).
    step gate-ordering-build nvcc -O3 -gencode "arch=compute_$arch,code=sm_$arch" \
        -DDAY87_ORDERING_BUILD -o "$out/gate_ordering" proof/gate.cu
    step gate-ordering "$out/gate_ordering"
    for tool in memcheck racecheck synccheck initcheck; do
        step "sanitize-gate-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 "$out/gate"
    done
    # memcheck only: initcheck reports every element of the backward's two cuBLAS
    # products as an uninitialized read, while each of those elements is checked
    # right against float64 (fast/NOTES.md, 2026-11-30).
    step sanitize-torch-memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 -c "$driver"
    # The epilogue's warp barriers, read from the PTX: no run can see a missing one.
    step warp-barriers python3 -m proof.ptx.warp_barriers
    step table python3 -m tests.test_fast
    step self-test python3 -m proof.self_test_fast
    wmma_plan="wmmaGemmKernel<tuned::version1::TilePlan<64, 64, 32, 32, 32, 3>"
    step plan-run env EXPECTED_PLAN="$wmma_plan" python3 -c "$plan_run"
    # What limits the kernel at 4096^3: tensor-pipe, shared-memory and L2 use, and why warps stall.
    step ncu ncu --clock-control none -k regex:wmmaGemmKernel -c 1 --metrics "$ncu_metrics" \
        python3 -c "import torch, day87_fast; \
a = torch.randn(4096, 4096, dtype=torch.half, device='cuda'); \
day87_fast.wmma_mm(a, a); torch.cuda.synchronize()"
fi

if [ "$part" = gate-bugs ]; then
    step planted-bugs python3 -m proof.planted_bugs
fi

if [ "$part" = bench ]; then
    step bench python3 -m bench.bench --picture "$out/bench-forward.svg"
fi

if [ "$part" = forward ]; then
    step gate-build nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o "$out/gate" proof/gate.cu
    step gate "$out/gate"
    step gate-compute75-build nvcc -O3 -gencode arch=compute_75,code=compute_75 \
        -o "$out/gate75" proof/gate.cu
    step gate-compute75 "$out/gate75"
    # The registers each plan takes in a T4's machine code: the occupancy arithmetic
    # in fast/NOTES.md starts from these.
    step sm75-resources bash -c "for source in launch_policy backward_version1_scaled; do
        nvcc -O3 -cubin -gencode arch=compute_75,code=sm_75 -o $out/\$source.cubin \
            csrc/\$source.cu &&
        cuobjdump --dump-resource-usage $out/\$source.cubin; rm -f $out/\$source.cubin; done"
    step forward-variants python3 -m bench.forward_variants
fi

if [ "$part" = compute75 ]; then
    # The T4's code path: compute_75 PTX, which the driver compiles for this card at
    # load. __CUDA_ARCH__ is 750 in it: synchronous copies, no cp.async, TuringPlan.
    step gate-compute75-build nvcc -O3 -lineinfo -gencode arch=compute_75,code=compute_75 \
        -o "$out/gate75" proof/gate.cu
    step gate-compute75 "$out/gate75"
    for tool in memcheck racecheck synccheck initcheck; do
        step "sanitize-gate-compute75-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
            "$out/gate75"
    done
    # day87_fast built here for 7.5+PTX alone (the lesson too, in a cache of its own).
    saved_path=${PYTHONPATH-}
    install_package /tmp/day87-fast-75 7.5+PTX
    export TORCH_CUDA_ARCH_LIST=7.5+PTX TORCH_EXTENSIONS_DIR="$out/cache75"
    step table-compute75 python3 -m tests.test_fast
    step sanitize-torch-compute75-memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 -c "$driver"
    step compute75-contents bash -c 'cuobjdump --list-elf --list-ptx \
        "$(python3 -c "import day87_fast; print(day87_fast.BUILD[\"library\"])")"'
    step compute75-plan-run \
        env EXPECTED_PLAN="wmmaGemmKernel<tuned::version1::TilePlan<128, 128, 64, 64, 16, 2>" \
        python3 -c "$plan_run"
    step compute75-variants python3 -m bench.forward_variants Plan
    unset TORCH_CUDA_ARCH_LIST TORCH_EXTENSIONS_DIR
    export PYTHONPATH=$saved_path
    rm -rf "$out"/cache75
fi

if [ "$part" = hopper ]; then
    step gate-build nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a \
        -o "$out/gate" proof/gate.cu
    step gate "$out/gate"
    step gate-persistent-forced env DAY87_FAST_KERNEL=persistent "$out/gate"
    step gate-ordering-build nvcc -O3 -gencode arch=compute_90a,code=sm_90a -DDAY87_ORDERING_BUILD \
        -o "$out/gate_ordering" proof/gate.cu
    step gate-ordering "$out/gate_ordering"
    # at shapes up to 512: the whole gate, for sm_90a; racecheck on the Hopper plans alone
    for tool in memcheck synccheck; do
        step "sanitize-gate-small-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
            "$out/gate" --small
    done
    step sanitize-gate-hopper-small-racecheck compute-sanitizer --tool racecheck \
        --error-exitcode 1 "$out/gate" --small --hopper
    step wgmma-order python3 -m proof.ptx.wgmma_order
    step tile-order-build nvcc -O3 -gencode arch=compute_90a,code=sm_90a \
        -o "$out/tile_order" bench/tile_order.cu
    step tile-order "$out/tile_order"
fi

if [ "$part" = hopper-bugs ]; then
    step planted-bugs-hopper python3 -m proof.planted_bugs hopper
fi

if [ "$part" = studies ]; then
    # Each study in fast/studies/ (tests/test_studies.py holds that every one is named
    # here). Version 2's driver checks it at the gate's Hopper shapes, times it beside
    # version 3 and compares their bits; its ordering build holds its pipeline back.
    step version2-build nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a \
        -o "$out/version2_hopper" studies/version2_hopper.cu
    step version2 "$out/version2_hopper"
    step version2-ordering-build nvcc -O3 -gencode arch=compute_90a,code=sm_90a \
        -DDAY87_ORDERING_BUILD -o "$out/version2_hopper_ordering" studies/version2_hopper.cu
    step version2-ordering "$out/version2_hopper_ordering"
    for tool in memcheck synccheck; do
        step "sanitize-version2-small-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
            "$out/version2_hopper" --small
    done
    step planted-bugs-study python3 -m proof.planted_bugs study
fi

if [ "$part" = hopper-tables ]; then
    # The wheel as a user installs it (every architecture, sm_90a among them): the driver
    # must choose the sm_90a code for the Hopper kernels to run.
    step table-persistent env DAY87_FAST_KERNEL=persistent python3 -m tests.test_fast
    step library-sass bash -c 'library=$(python3 -c "import day87_fast
print(day87_fast.BUILD[\"library\"])") && cuobjdump --list-elf --list-ptx "$library" &&
        echo "HGMMA instructions: $(cuobjdump --dump-sass "$library" | grep -c HGMMA)"'
    step table-auto python3 -m tests.test_fast
    step table-wmma env DAY87_FAST_KERNEL=wmma python3 -m tests.test_fast
    # and built for 7.5+PTX alone: the T4's code
    saved_path=${PYTHONPATH-}
    install_package /tmp/day87-fast-75 7.5+PTX
    step table-compute75 env TORCH_CUDA_ARCH_LIST=7.5+PTX TORCH_EXTENSIONS_DIR="$out/cache75" \
        python3 -m tests.test_fast
    export PYTHONPATH=$saved_path
    step bench-forward python3 -m bench.bench --forward --picture "$out/bench-forward.svg"
    rm -rf "$out"/cache75
fi

rm -f "$out/gate" "$out/gate75" "$out/gate_ordering" "$out/tile_order" "$out/version2_hopper" \
    "$out/version2_hopper_ordering"
echo "fast/proof/gpu_check $part: $failures step(s) failed" | tee -a "$log"
exit "$failures"

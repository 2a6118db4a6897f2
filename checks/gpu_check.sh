#!/usr/bin/env bash
# gpu_check.sh: every GPU-side check of the lesson, on one machine, in four parts
# that each run on their own.
#
#   bash checks/gpu_check.sh lesson OUT      # gate, harness with and without the GPU,
#                                            # self-test, fuzz, the registration bands
#                                            # (OUT/bands.svg), ncu on the kernel, row 11
#                                            # against a binding that synchronizes
#   bash checks/gpu_check.sh answer-key OUT  # a solved copy (checks/solved.py): the gate
#                                            # and compute-sanitizer, harness (check 6's
#                                            # CUDA rows), the bias through torch under
#                                            # memcheck, self-test
#   bash checks/gpu_check.sh mistakes OUT    # the exercise's mistakes that a GPU shows
#   bash checks/gpu_check.sh builds OUT      # compute-sanitizer on the gate and through
#                                            # torch; the compute_75 PTX path (the T4's
#                                            # code, JIT-compiled): gate and harness; pip's
#                                            # CUDA toolkit alone; the build checks; an
#                                            # AOTInductor package of the op
#
# For pip's toolkit the part expects the cuda-toolkit[nvcc,cccl] wheels, at torch's
# CUDA version, installed with `pip install --target "$PIP_TOOLKIT_SITE"`; it skips
# that step, saying so, where none are there. Each step's output goes to the
# console and to OUT/PART.log; the exit status is the number of steps that failed.
set -u
part=${1:-}
out=${2:-}
case "$part" in
    lesson | answer-key | mistakes | builds)
        [ -n "$out" ] || { echo "usage: bash checks/gpu_check.sh $part OUT" >&2; exit 2; } ;;
    *) echo "usage: bash checks/gpu_check.sh lesson|answer-key|mistakes|builds OUT" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."   # the lesson's folder
# OUT and its log, step, and the provenance step: shared with fast/proof/gpu_check.sh
source checks/gpu_check_steps.sh
# This card's architecture, for the gate's native build.
arch=$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}{n}')")

if [ "$part" = lesson ]; then
    step gate-build nvcc -O3 -lineinfo -gencode "arch=compute_$arch,code=sm_$arch" \
        -o "$out/gate" gate.cu
    step gate "$out/gate"
    step harness python3 test_op.py
    step harness-no-gpu env CUDA_VISIBLE_DEVICES= python3 test_op.py
    step self-test python3 checks/self_test.py
    step hardening python3 checks/hardening.py
    step fuzz python3 checks/fuzz.py "${FUZZ_CALLS:-5000}" --seed 87
    # What limits the kernel at 4096^3: tensor-pipe, shared-memory and L2 use, and why warps stall.
    step ncu ncu --clock-control none -k regex:wmmaGemmKernel -c 1 --metrics "$ncu_metrics" \
        python3 -c "import torch, op; \
a = torch.randn(4096, 4096, dtype=torch.half, device='cuda'); \
op.wmma_mm(a, a); torch.cuda.synchronize()"
    step registration-bands python3 checks/registration_bands.py --svg "$out/bands.svg"
    # Row 11 against a binding that synchronizes the device after each launch, which
    # sync debug mode does not see: the row must fail, naming the wait.
    wrong=$(mktemp -d)
    cp kernel.cu binding.cpp op.py test_op.py "$wrong"/
    planted='    cudaDeviceSynchronize();  // planted: a device-wide barrier'
    sed -i "s|^    // Raise, never exit: std::exit|$planted\\n&|" "$wrong/binding.cpp"
    grep -q "planted: a device-wide barrier" "$wrong/binding.cpp" \
        || echo "=== the planted synchronize did not apply"
    row11='import sys, test_op
try:
    test_op.check_no_host_sync(test_op.LESSON)
except test_op.Fail as failure:
    sys.exit(print("row 11 failed, as it must:", failure))
sys.exit("row 11 passed against a binding that synchronizes the device")'
    step row11-sees-cudaDeviceSynchronize \
        bash -c 'cd "$1" && TORCH_EXTENSIONS_DIR="$2" python3 -c "$3"' \
        _ "$wrong" "$out/cache-wrong" "$row11"
    rm -rf "$wrong" "$out/cache-wrong"
fi

if [ "$part" = answer-key ]; then
    # A solved copy of the seven files and checks/: the answer key applied, or the
    # folder's own solution where the exercise is solved.
    solved=$(mktemp -d)/solved
    step solved-copy python3 checks/solved.py "$solved"
    export TORCH_EXTENSIONS_DIR="$out/cache-solved"
    step key-gate-build nvcc -O3 -lineinfo -gencode "arch=compute_$arch,code=sm_$arch" \
        -o "$out/gate" "$solved/gate.cu"
    step key-gate "$out/gate"
    for tool in memcheck racecheck; do
        step "key-sanitize-gate-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
            "$out/gate"
    done
    step key-harness bash -c "cd $solved && python3 test_op.py"
    key_driver='import torch, op
a = torch.randn(256, 384, dtype=torch.half, device="cuda", requires_grad=True)
b = torch.randn(384, 512, dtype=torch.half, device="cuda", requires_grad=True)
bias = torch.randn(512, device="cuda", requires_grad=True)
op.wmma_mm_bias(a, b, bias).sum().backward()
op.wmma_mm(a, b).sum().backward()
torch.cuda.synchronize()
print("driver: wmma_mm_bias and wmma_mm (no bias: nullptr), forward and backward done")'
    step key-sanitize-torch-memcheck \
        bash -c 'cd "$1" && compute-sanitizer --tool memcheck --error-exitcode 1 python3 -c "$2"' \
        _ "$solved" "$key_driver"
    step key-self-test bash -c "cd $solved && python3 checks/self_test.py"
    unset TORCH_EXTENSIONS_DIR
    rm -rf "$(dirname "$solved")" "$out"/cache-solved
fi

if [ "$part" = mistakes ]; then
    step student-mistakes python3 checks/student_mistakes.py --on-gpu
fi

if [ "$part" = builds ]; then
    # compute-sanitizer: the gate (a native build and a compute_75 one), then the
    # operator's forward and backward through torch.
    step gate-build nvcc -O3 -lineinfo -gencode "arch=compute_$arch,code=sm_$arch" \
        -o "$out/gate" gate.cu
    step gate-compute75-build nvcc -O3 -lineinfo -gencode arch=compute_75,code=compute_75 \
        -o "$out/gate75" gate.cu
    driver='import torch, op
a = torch.randn(256, 384, dtype=torch.half, device="cuda", requires_grad=True)
b = torch.randn(384, 512, dtype=torch.half, device="cuda", requires_grad=True)
op.wmma_mm(a, b).sum().backward()
c = op.wmma_mm(torch.randn(128, 48, dtype=torch.half, device="cuda"),
               torch.randn(48, 256, dtype=torch.half, device="cuda"))
torch.cuda.synchronize()
print("driver: forward and backward done")'
    for tool in memcheck racecheck synccheck initcheck; do
        step "sanitize-gate-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 "$out/gate"
        step "sanitize-gate-compute75-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
            "$out/gate75"
    done
    # memcheck only: initcheck reports every element of the backward's two cuBLAS
    # products as an uninitialized read, while each of those elements is checked
    # right against float64 (checks/NOTES.md, 2026-11-30).
    step sanitize-torch-memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 -c "$driver"

    # The T4's code path: compute_75 PTX, which the driver compiles for this card
    # at load. __CUDA_ARCH__ is 750 in it: synchronous copies, no cp.async.
    step gate-compute75 "$out/gate75"
    step harness-compute75 env TORCH_CUDA_ARCH_LIST=7.5+PTX TORCH_EXTENSIONS_DIR="$out/cache75" \
        python3 test_op.py
    step sanitize-torch-compute75-memcheck env TORCH_CUDA_ARCH_LIST=7.5+PTX \
        TORCH_EXTENSIONS_DIR="$out/cache75" \
        compute-sanitizer --tool memcheck --error-exitcode 1 python3 -c "$driver"
    step compute75-contents \
        bash -c "cuobjdump --list-elf --list-ptx $out/cache75/day87-*/day87_ext.so"

    # pip's toolkit alone: no CUDA_HOME, no nvcc on PATH.
    if [ -d "${PIP_TOOLKIT_SITE:-/nonexistent}/nvidia" ]; then
        path_without_nvcc=$(python3 -c 'import os; print(os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep)
            if p and not os.path.exists(os.path.join(p, "nvcc"))))')
        step harness-pip-toolkit env -u CUDA_HOME -u CUDA_PATH PATH="$path_without_nvcc" \
            PYTHONPATH="$PIP_TOOLKIT_SITE" TORCH_EXTENSIONS_DIR="$out/cache-pip" python3 test_op.py
    else
        echo "=== harness-pip-toolkit: skipped, no wheels in PIP_TOOLKIT_SITE" | tee -a "$log"
    fi
    step build-checks python3 -m pytest -q -p no:cacheprovider checks/test_build.py \
        -k "keyed or concurrent or reload or two_copies or torch_check or statically"
    step aoti python3 -m pytest -q -p no:cacheprovider checks/test_aoti.py
    rm -rf "$out"/cache75 "$out"/cache-pip
fi

rm -f "$out/gate" "$out/gate75"
echo "gpu_check $part: $failures step(s) failed" | tee -a "$log"
exit "$failures"

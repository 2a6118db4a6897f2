#!/usr/bin/env bash
# gpu_check.sh: every GPU-side check of the lesson, in one run on one card.
#
#   bash checks/gpu_check.sh [output folder]      (default: ./gpu-check-out)
#
# The standalone gate, the harness with and without the GPU visible, the
# self-test, the fuzzer, the build and import checks, the benchmark, and
# compute-sanitizer's four tools on the gate and on the operator driven through
# torch. Each step's output goes to the console and to gpu_check.log; the exit
# status is the number of steps that failed. FUZZ_CALLS sets the fuzz size.
set -u
cd "$(dirname "$0")/.."   # the lesson's folder
out=${1:-gpu-check-out}
mkdir -p "$out"
log="$out/gpu_check.log"
: >"$log"
export PYTHONUNBUFFERED=1
failures=0

step() {  # step NAME COMMAND...: run, log, and count a failure
    local name=$1
    shift
    echo "=== $name: $*" | tee -a "$log"
    local start=$SECONDS
    "$@" 2>&1 | tee -a "$log"
    local status=${PIPESTATUS[0]}
    echo "=== $name: exit $status after $((SECONDS - start)) s" | tee -a "$log"
    [ "$status" -eq 0 ] || failures=$((failures + 1))
}

arch=$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'sm_{m}{n}')")
step provenance bash -c 'date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -2'
step gate-build nvcc -O3 -lineinfo -arch="$arch" -o gate gate.cu
step gate ./gate
step harness python3 test_op.py
step harness-no-gpu env CUDA_VISIBLE_DEVICES= python3 test_op.py
step self-test python3 checks/self_test.py
step bench python3 checks/bench.py
# What limits the kernel at 4096^3: tensor-pipe, shared-memory and L2 use, and why warps stall.
step ncu ncu --clock-control none -k regex:wmmaGemmKernel -c 1 --metrics \
gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,\
sm__warps_active.avg.per_cycle_active,smsp__average_warp_latency_issue_stalled_wait.ratio,\
smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_barrier.ratio,\
smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_mio_throttle.ratio \
    python3 -c "import torch, op; a = torch.randn(4096, 4096, dtype=torch.half, device='cuda'); op.wmma_mm(a, a); torch.cuda.synchronize()"

# compute-sanitizer: the gate, then the operator's forward and backward through torch.
driver='import torch, op
a = torch.randn(256, 384, dtype=torch.half, device="cuda", requires_grad=True)
b = torch.randn(384, 512, dtype=torch.half, device="cuda", requires_grad=True)
op.wmma_mm(a, b).sum().backward()
c = op.wmma_mm(torch.randn(128, 48, dtype=torch.half, device="cuda"), torch.randn(48, 256, dtype=torch.half, device="cuda"))
torch.cuda.synchronize()
print("driver: forward and backward done")'
for tool in memcheck racecheck synccheck initcheck; do
    step "sanitize-gate-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 ./gate
    step "sanitize-torch-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 python3 -c "$driver"
done

step build-times python3 checks/bench.py --build-times
step build-checks python3 -m pytest -q checks/test_build.py -k "keyed or concurrent or reload"
step fuzz python3 checks/fuzz.py "${FUZZ_CALLS:-10000}" --seed 87

echo "gpu_check: $failures step(s) failed" | tee -a "$log"
exit "$failures"

# checks/gpu_check_steps.sh: the opening that both gpu_check.sh scripts share, the
# lesson's (checks/gpu_check.sh) and the fast tier's (fast/proof/gpu_check.sh), which
# source it from the lesson's folder once they have read PART and OUT:
#
#   cd "$(dirname "$0")/.."   # the lesson's folder
#   source checks/gpu_check_steps.sh
#
# It makes OUT (taken from the lesson's folder, as both scripts always have) and makes
# its path absolute, so that a script may move to another folder afterwards; starts
# OUT/PART.log empty; defines step, which runs one check and counts its failure in
# $failures (each script's exit status); names ncu_metrics; and runs the first step,
# provenance: the date, the card and its driver, nvcc and torch.
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/$part.log"
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

# What limits wmmaGemmKernel at 4096^3, as both scripts' ncu step asks it: its time,
# tensor-pipe, shared-memory and L2 use, and why its warps stall.
ncu_metrics=\
gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,\
sm__warps_active.avg.per_cycle_active,smsp__average_warp_latency_issue_stalled_wait.ratio,\
smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_barrier.ratio

step provenance bash -c 'date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
    nvcc --version | tail -2; python3 -c "import torch; print(\"torch\", torch.__version__)"'

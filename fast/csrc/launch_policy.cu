// fast/csrc/launch_policy.cu: which of the fast forward's five versions runs a call, and
// launchFastGemm, the launcher that fast/csrc/binding.cpp calls.
//
// The versions, each in a file of its own, the simplest first:
//   1. version1_wmma.cuh, wmmaGemmKernel: WMMA under three tile plans, K split on
//      small grids; any card from sm_75 up;
//   2. version2_hopper.cuh, hopperGemmKernel: TMA, mbarriers and warpgroup MMAs
//      (wgmma), a block per tile; Hopper, sm_90a code;
//   3. version3_persistent.cuh, hopperPersistentKernel: version 2's pipeline in a
//      persistent grid; where the launcher would choose version 2;
//   4. version4_cluster.cuh, hopperClusterKernel: version 3's in clusters of two
//      blocks, B multicast, C stored by TMA; only where forced (chooseLaunch says why);
//   5. version5_split_cluster.cuh, wmmaClusterSplitKernel: version 1 with K split, the
//      splits of a tile in one cluster, added through distributed shared memory in
//      the same launch; sm_90 and up, only where forced (chooseLaunch says why).
// What they share is in common.cuh. Here: the device's facts (asked once per device
// and thread), DAY87_FAST_KERNEL, chooseLaunch (the policy, and the figures behind
// it), and the launcher. Every figure behind a choice is in fast/NOTES.md.
//
// Built two ways:
//   - by fast/setup.py, into day87_fast's wheel, with fast/csrc/backward_version1_scaled.cu
//     and fast/csrc/binding.cpp (and the sm_90a target wherever the list names 9.0);
//   - included by fast/proof/gate.cu, the standalone check:
//       nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o gate fast/proof/gate.cu && ./gate
//
// This file never exits and never waits for the caller's work: the launchers return the
// launch status, and the caller (an operator that raises, or fast/proof/gate.cu's
// CUDA_CHECK) decides what an error means. The one wait is runsHopperCode's, once per
// device and thread, for a one-thread probe on a stream of its own.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.cuh"
#include "version1_wmma.cuh"
#include "version2_hopper.cuh"
#include "version3_persistent.cuh"
#include "version4_cluster.cuh"
#include "version5_split_cluster.cuh"

namespace tuned {

// ---------------------------------------------------------------------------
// The device's facts
// ---------------------------------------------------------------------------
// What the launchers depend on that cannot change while the process runs: which code
// the driver runs on the device (the PTX architecture the kernels were compiled for:
// 75 in a T4's build, and in a compute_75 build on any card), whether that code has
// the Hopper kernel, and its number of SMs. Each thread asks the runtime once per
// device and keeps the answer, for each device it uses (currentDeviceFacts).
struct DeviceFacts {
    bool known;             // asked already
    bool turing;            // code for below sm_80: no cp.async (TuringPlan)
    bool sm90_code;         // code for sm_90 and up, CUDA 12 or newer: letDependentsStart
                            // (version 1's reduction) and clusters (version 5)
    bool hopper;            // sm_90a code with the Hopper kernels' bodies, and TMA's encoder
    int multiprocessors;
    int clusters;           // version 4's clusters resident at once (where hopper, else 0)
};

#if CUDART_VERSION >= 12000
// Whether this device runs sm_90a code: 1 only where the code that the driver chose
// for it was compiled with the Hopper kernels' bodies. Read once per device and thread
// (runsHopperCode, below).
__device__ int hopper_code_ran;

__global__ void hopperCodeProbe() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    hopper_code_ran = 1;
#else
    hopper_code_ran = 0;
#endif
}

// Whether this device runs the Hopper kernel's body: only a card of capability 9.0 can,
// and only where the library holds sm_90a code, which the driver may not pick when it
// holds sm_90 code too. So hopperCodeProbe says which code ran (once per device and
// thread: currentDeviceFacts remembers), on a stream of its own, waited for alone.
// Relaxed capture mode lets this run while the caller's stream is being captured into
// a CUDA graph: nothing of it joins the graph.
cudaError_t runsHopperCode(int device, bool* hopper) {
    int major, minor;
    cudaError_t status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (status == cudaSuccess)
        status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    *hopper = false;
    if (status != cudaSuccess || major != 9 || minor != 0 || tensorMapEncoder() == nullptr)
        return status;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if ((status = cudaThreadExchangeStreamCaptureMode(&mode)) != cudaSuccess) return status;
    cudaStream_t stream;
    int ran = 0;
    status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (status == cudaSuccess) {
        hopperCodeProbe<<<1, 1, 0, stream>>>();
        status = cudaGetLastError();
        if (status == cudaSuccess)
            status = cudaMemcpyFromSymbolAsync(&ran, hopper_code_ran, sizeof(int), 0,
                                               cudaMemcpyDeviceToHost, stream);
        const cudaError_t synchronized = cudaStreamSynchronize(stream);
        if (status == cudaSuccess) status = synchronized;
        cudaStreamDestroy(stream);
    }
    cudaThreadExchangeStreamCaptureMode(&mode);  // the caller's mode, back
    *hopper = status == cudaSuccess && ran == 1;
    return status;
}
#endif

#if CUDART_VERSION >= 12000
// How many of version 4's clusters the current device holds at once, or 0 where the
// runtime cannot say (then DAY87_FAST_KERNEL=cluster runs version 3): a failure here
// must not fail the calls that never run version 4. Both plans take one block an SM
// (version4_cluster.cuh asserts it), so the wide plan's count is the narrow one's. Asked
// in relaxed capture mode, as the probe is, so that a first call inside a CUDA graph's
// capture may ask.
int residentClustersOrNone() {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int clusters = 0;
    if (version4::residentClusters<HopperWidePlan>(&clusters) != cudaSuccess) {
        cudaGetLastError();  // the failure is answered by 0, not left for the next call
        clusters = 0;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);  // the caller's mode, back
    return clusters;
}
#endif

// One entry per device ordinal, so that a thread that alternates between devices
// probes each once (runsHopperCode waits for its probe). A device past the last entry
// is asked at every call: correct, only slower.
constexpr int kDevicesRemembered = 64;

cudaError_t currentDeviceFacts(DeviceFacts* facts) {
    thread_local DeviceFacts remembered[kDevicesRemembered] = {};
    int device;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    DeviceFacts asked{};
    DeviceFacts& cached = device < kDevicesRemembered ? remembered[device] : asked;
    if (!cached.known) {
        cudaFuncAttributes compiled;
        if ((status = cudaFuncGetAttributes(&compiled, version1::splitSumKernel)) != cudaSuccess)
            return status;
        int multiprocessors;
        status = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
        if (status != cudaSuccess) return status;
        bool hopper = false;
        int clusters = 0;
#if CUDART_VERSION >= 12000
        if ((status = runsHopperCode(device, &hopper)) != cudaSuccess) return status;
        if (hopper) clusters = residentClustersOrNone();
#endif
        cached = DeviceFacts{true, compiled.ptxVersion < 80,
                             compiled.ptxVersion >= 90 && CUDART_VERSION >= 12000, hopper,
                             multiprocessors, clusters};
    }
    *facts = cached;
    return cudaSuccess;
}

// Which kernel a call runs: DAY87_FAST_KERNEL=split (version 5), cluster (version 4),
// persistent (version 3), hopper (version 2) or wmma (version 1) forces one, and unset (or
// auto) lets chooseLaunch choose. It is read at every call, so that one process can time
// both (fast/bench/bench.py); a CUDA graph keeps the kernel it captured.
enum class KernelSwitch { kAuto, kSplit, kCluster, kPersistent, kHopper, kWmma, kUnknown };

KernelSwitch kernelSwitch() {
    const char* value = std::getenv("DAY87_FAST_KERNEL");
    if (value == nullptr || !std::strcmp(value, "") || !std::strcmp(value, "auto"))
        return KernelSwitch::kAuto;
    if (!std::strcmp(value, "split")) return KernelSwitch::kSplit;
    if (!std::strcmp(value, "cluster")) return KernelSwitch::kCluster;
    if (!std::strcmp(value, "persistent")) return KernelSwitch::kPersistent;
    if (!std::strcmp(value, "hopper")) return KernelSwitch::kHopper;
    if (!std::strcmp(value, "wmma")) return KernelSwitch::kWmma;
    return KernelSwitch::kUnknown;
}

// Versions 2 to 4: the kernels that only a Hopper card's sm_90a code runs.
bool forcesHopperKernel(KernelSwitch wanted) {
    return wanted == KernelSwitch::kCluster || wanted == KernelSwitch::kPersistent ||
           wanted == KernelSwitch::kHopper;
}

// Why DAY87_FAST_KERNEL cannot be honoured on the current device, or "" where it can:
// fast/csrc/binding.cpp raises with it before a launch, where the launcher itself could
// only answer an error code.
std::string kernelSwitchProblem() {
    const KernelSwitch wanted = kernelSwitch();
    const char* value = std::getenv("DAY87_FAST_KERNEL");
    if (wanted == KernelSwitch::kUnknown)
        return std::string(
                   "DAY87_FAST_KERNEL must be split, cluster, persistent, hopper, wmma or auto; "
                   "got '") +
               value + "'";
    DeviceFacts facts;
    if (wanted == KernelSwitch::kSplit && currentDeviceFacts(&facts) == cudaSuccess &&
        !facts.sm90_code)
        return "DAY87_FAST_KERNEL=split, and this device does not run version 5: its clusters "
               "need code for sm_90 or newer, built with CUDA 12 or newer";
    if (!forcesHopperKernel(wanted) || currentDeviceFacts(&facts) != cudaSuccess || facts.hopper)
        return "";
    return std::string("DAY87_FAST_KERNEL=") + value +
           ", and this device does not run the Hopper kernels: they run only on a card of "
           "capability 9.0, from code built for sm_90a with CUDA 12 or newer (fast/setup.py adds "
           "that target to every architecture list that names 9.0)";
}

// Which plan and how many splits of K a call runs: chooseLaunch (below) alone decides,
// for the launcher and for the workspace size that binding.cpp allocates.
enum class PlanChoice {
    kSquare, kSmallGrid, kTuring, kHopperWide, kHopperNarrow, kPersistentWide, kPersistentNarrow,
    kClusterWide, kClusterNarrow, kSplitInCluster
};

struct LaunchChoice {
    PlanChoice plan;
    int splits;
};

// A 128 x 128 block walks all of K alone, so a grid of fewer such tiles than SMs
// leaves most of the card idle (the lesson's 256 x 512 output is 8 tiles for an
// H200's 132 SMs). There the launcher takes SmallGridPlan's 64 x 64 tiles, four times
// as many. Where even those are fewer than the SMs, K is split into enough runs to
// give every SM a block, each of at least kMinStagesPerSplit stages, so that its
// pipeline has stages in flight. Below kMinDepthToSplit one block per tile measured
// faster: a short K does not repay the reduction's launch. A T4's build keeps
// TuringPlan and splits it the same way. (fast/NOTES.md has the split table.)
//
// The Hopper kernels, where the device runs them, take every grid of at least as many
// 128 x 128 tiles as SMs: version 3, the persistent one (level with version 2, within
// their replays' spread: fast/NOTES.md, "The Hopper kernel: versions 2 and 3");
// version 2 and version 4 only where forced. Version 4 would be chosen
// where it measures at least 2% faster than version 3 in both orders at two large
// shapes; it measured level or slower (fast/NOTES.md, "Version 4"). Forced, it takes
// an even number of tile rows, and version 3 the rest. Smaller grids stay with version
// 1's small tiles and split K (the Hopper kernels do not split K, and lose there). The wide
// tile where 256 divides N and the wide grid takes at most half as many waves of
// blocks as the narrow one (a wave of wide tiles lasts about two of narrow ones;
// 2048^3: one wave of 128 wide tiles against two of 256 narrow ones, and the wide
// ones measured faster); else the narrow tile. Forced, a Hopper kernel takes every
// shape, wide where N allows, but K = 0: a tensor map of no columns cannot be
// encoded, and version 1 writes the bias (or zeros) there.
//
// Version 5 adds version 1's splits in the same launch instead of a second, and would
// be chosen where version 1 splits K; it measured slower there than version 1's two
// launches, at both of the lesson's shapes (fast/NOTES.md, "Version 5"). Forced, on
// code for sm_90 or newer, it takes SmallGridPlan's tiles and splits every shape whose
// K has two stages for each of two splits, into at least two and at most 8 (a
// cluster's most); version 1 takes the rest.
constexpr int kMinStagesPerSplit = 2;
constexpr int kMinDepthToSplit = 256;

cudaError_t chooseLaunch(int m, int n, int k, LaunchChoice* choice) {
    DeviceFacts facts;
    const cudaError_t status = currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    const KernelSwitch wanted = kernelSwitch();
    const bool forced_hopper = forcesHopperKernel(wanted);
    if (wanted == KernelSwitch::kUnknown || (forced_hopper && !facts.hopper) ||
        (wanted == KernelSwitch::kSplit && !facts.sm90_code))
        return cudaErrorInvalidValue;  // kernelSwitchProblem says why
    const int large_tiles = (m / kTileM) * (n / kTileN);
#if CUDART_VERSION >= 12000
    if (facts.hopper && wanted != KernelSwitch::kWmma && wanted != KernelSwitch::kSplit && k > 0 &&
        (forced_hopper || large_tiles >= facts.multiprocessors)) {
        const auto waves = [&](int tiles) {
            return (tiles + facts.multiprocessors - 1) / facts.multiprocessors;
        };
        const bool wide = n % HopperWidePlan::kBlockN == 0 &&
                          (forced_hopper || 2 * waves(large_tiles / 2) <= waves(large_tiles));
        // Version 4's clusters take tiles in pairs along M: an odd number of them (or a
        // device whose clusters could not be counted) is version 3's.
        const bool even_rows = m / kTileM % version4::kClusterSize == 0 && facts.clusters > 0;
        if (wanted == KernelSwitch::kHopper)
            *choice = LaunchChoice{wide ? PlanChoice::kHopperWide : PlanChoice::kHopperNarrow, 1};
        else if (wanted == KernelSwitch::kCluster && even_rows)
            *choice = LaunchChoice{wide ? PlanChoice::kClusterWide : PlanChoice::kClusterNarrow, 1};
        else
            *choice =
                LaunchChoice{wide ? PlanChoice::kPersistentWide : PlanChoice::kPersistentNarrow, 1};
        return cudaSuccess;
    }
#endif
    const int small_tiles =
        (m / version1::SmallGridPlan::kBlockM) * (n / version1::SmallGridPlan::kBlockN);
    // As many splits as give every SM a block, where K is at least min_depth; each of
    // at least kMinStagesPerSplit stages, at most `most`; 1 is no split.
    const auto splits_for = [&](int tiles, int stage_depth, int min_depth, int most) {
        const int k_tiles = (k + stage_depth - 1) / stage_depth;
        const int wanted_splits =
            tiles && k >= min_depth ? (facts.multiprocessors + tiles - 1) / tiles : 1;
        return std::max(1, std::min({wanted_splits, k_tiles / kMinStagesPerSplit, most}));
    };
    if (wanted == KernelSwitch::kSplit) {  // on sm_90 code: checked above
        const int stage_depth = version1::SmallGridPlan::kBlockK;
        const int k_tiles = (k + stage_depth - 1) / stage_depth;
        const int most = version5::kMaxSplits;
        // two at least, even where a block a tile fills the card
        const int splits = std::min({std::max(2, splits_for(small_tiles, stage_depth, 0, most)),
                                     k_tiles / kMinStagesPerSplit, most});
        if (splits > 1) {
            *choice = LaunchChoice{PlanChoice::kSplitInCluster, splits};
            return cudaSuccess;
        }
    }
    choice->plan = facts.turing ? PlanChoice::kTuring
                   : large_tiles < facts.multiprocessors ? PlanChoice::kSmallGrid
                                                         : PlanChoice::kSquare;
    const bool small = choice->plan == PlanChoice::kSmallGrid;
    const int stage_depth = facts.turing ? version1::TuringPlan::kBlockK
                            : small      ? version1::SmallGridPlan::kBlockK
                                         : version1::SquarePlan::kBlockK;
    choice->splits = splits_for(small ? small_tiles : large_tiles, stage_depth, kMinDepthToSplit,
                                version1::kMaxSplits);
    return cudaSuccess;
}

// The bytes of workspace launchFastGemm needs for this shape on the current device:
// 0 where K is not split.
size_t fastGemmWorkspaceBytes(size_t m, size_t n, size_t k) {
    LaunchChoice choice{PlanChoice::kSquare, 1};
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX ||
        chooseLaunch(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                     &choice) != cudaSuccess)
        return 0;  // the launch then fails with the same error, and says so
    // Version 5 adds its splits in shared memory: no workspace.
    return choice.splits > 1 && choice.plan != PlanChoice::kSplitInCluster
               ? choice.splits * m * n * sizeof(float)
               : 0;
}

// The plan chosen for these operands, on `stream`. It checks the shape rules again,
// because a caller that skipped them would read and write out of bounds; it answers
// cudaErrorInvalidValue instead.
cudaError_t launchChosenPlan(const FastGemmOperands& operands, float* workspace,
                             cudaStream_t stream) {
    if (operands.m < 0 || operands.n < 0 || operands.k < 0 || operands.m % kTileM != 0 ||
        operands.n % kTileN != 0 || operands.k % kTileK != 0)
        return cudaErrorInvalidValue;
    if (operands.m == 0 || operands.n == 0) return cudaSuccess;  // an empty C: nothing to launch
    LaunchChoice choice;
    cudaError_t status = chooseLaunch(operands.m, operands.n, operands.k, &choice);
    if (status != cudaSuccess) return status;
    // The caller sized the workspace from an earlier reading of DAY87_FAST_KERNEL; if
    // another thread changed it since (hopper then, unset now), a split may have no
    // workspace: refused. (Where both readings split K, they split it alike: auto and
    // wmma choose version 1's plans by the same rule.)
    if (choice.splits > 1 && choice.plan != PlanChoice::kSplitInCluster && workspace == nullptr)
        return cudaErrorInvalidValue;
    DeviceFacts facts;  // chooseLaunch asked for them: remembered, not asked again
    if ((status = currentDeviceFacts(&facts)) != cudaSuccess) return status;
    const bool dependent = facts.sm90_code;
    switch (choice.plan) {
        case PlanChoice::kTuring:
            return version1::launchPlan<version1::TuringPlan>(operands, choice.splits, workspace,
                                                              dependent, stream);
        case PlanChoice::kSmallGrid:
            return version1::launchPlan<version1::SmallGridPlan>(operands, choice.splits, workspace,
                                                                 dependent, stream);
        case PlanChoice::kSplitInCluster:
            return version5::launchClusterSplitPlan<version1::SmallGridPlan>(
                operands, choice.splits, facts.sm90_code, stream);
#if CUDART_VERSION >= 12000
        case PlanChoice::kHopperWide:
            return version2::launchHopperPlan<HopperWidePlan>(operands, stream);
        case PlanChoice::kHopperNarrow:
            return version2::launchHopperPlan<HopperNarrowPlan>(operands, stream);
        case PlanChoice::kPersistentWide:
            return version3::launchPersistentPlan<HopperWidePlan>(operands, facts.multiprocessors,
                                                                  stream);
        case PlanChoice::kPersistentNarrow:
            return version3::launchPersistentPlan<HopperNarrowPlan>(operands, facts.multiprocessors,
                                                                    stream);
        case PlanChoice::kClusterWide:
            return version4::launchClusterPlan<HopperWidePlan>(operands, facts.clusters, stream);
        case PlanChoice::kClusterNarrow:
            return version4::launchClusterPlan<HopperNarrowPlan>(operands, facts.clusters, stream);
#else
        case PlanChoice::kHopperWide: case PlanChoice::kHopperNarrow:
        case PlanChoice::kPersistentWide: case PlanChoice::kPersistentNarrow:
        case PlanChoice::kClusterWide: case PlanChoice::kClusterNarrow:
            return cudaErrorNotSupported;
#endif
        case PlanChoice::kSquare: break;
    }
    return version1::launchPlan<version1::SquarePlan>(operands, choice.splits, workspace, dependent,
                                                      stream);
}

// What fast/csrc/binding.cpp calls: launches on `stream` and returns the launch status,
// with `workspace` as fastGemmWorkspaceBytes asked for and `bias` nullptr or N floats.
// Sizes past an int, or a grid of more tiles than a launch can hold, answer
// cudaErrorInvalidValue. fast/csrc/binding.cpp declares it too: a change to its parameters
// goes in both files.
cudaError_t launchFastGemm(const half* a, const half* b, const float* bias, float* c, size_t m,
                           size_t n, size_t k, float* workspace, cudaStream_t stream) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
    if ((m / kTileM) * (n / kTileN) > INT_MAX) return cudaErrorInvalidValue;
    FastGemmOperands operands{};
    operands.a = a;
    operands.b = b;
    operands.c = c;
    operands.m = static_cast<int>(m);
    operands.n = static_cast<int>(n);
    operands.k = static_cast<int>(k);
    operands.bias = bias;
    return launchChosenPlan(operands, workspace, stream);
}

}  // namespace tuned

// fast/csrc/launch_policy.cu: which of the fast forward's versions runs a call, and
// launchFastGemm, the launcher that fast/csrc/binding.cpp calls.
//
// The versions the package holds, each in a file of its own, each chosen on some card at
// some shape:
//   1. version1_wmma.cuh, wmmaGemmKernel: WMMA under three tile plans, K split on
//      small grids; any card from sm_75 up;
//   3. version3_persistent.cuh, hopperPersistentKernel: TMA, mbarriers and warpgroup
//      MMAs (wgmma) in a persistent grid; Hopper, sm_90a code.
// The launcher chooses no other. Version 2, version 3 with a block per tile, which version
// 3 replaced, stands apart as a study (fast/studies/version2_hopper.cu, built and run on its
// own); versions 4 (clusters) and 5 (K split in a cluster), never chosen, left the
// package. kVersionsElsewhere says where each is now; fast/NOTES.md ("The versions") has
// why, and their figures.
// What the versions share is in common.cuh. Here: the device's facts (asked once per
// device and thread), DAY87_FAST_KERNEL, chooseLaunch (the policy, and the figures behind
// it), and the launcher. Every figure behind a choice is in fast/NOTES.md.
//
// Built two ways:
//   - by fast/setup.py, into day87_fast's wheel, with fast/csrc/backward_version1_scaled.cu
//     and fast/csrc/binding.cpp (and the sm_90a target wherever the list names 9.0);
//   - included by fast/proof/gate_check.cuh, and so by the programs that include that:
//     fast/proof/gate.cu, the standalone check, and the studies (fast/studies/):
//       nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o gate fast/proof/gate.cu && ./gate
//
// This file never exits and never waits for the caller's work: the launchers return the
// launch status, and the caller (an operator that raises, or a program's CUDA_CHECK)
// decides what an error means. The one wait is runsHopperCode's, once per
// device and thread, for a one-thread probe on a stream of its own.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.cuh"
#include "version1_wmma.cuh"
#include "version3_persistent.cuh"

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
                            // (version 1's reduction)
    bool hopper;            // sm_90a code with the Hopper kernel's body, and TMA's encoder
    int multiprocessors;
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
#if CUDART_VERSION >= 12000
        if ((status = runsHopperCode(device, &hopper)) != cudaSuccess) return status;
#endif
        cached = DeviceFacts{true, compiled.ptxVersion < 80,
                             compiled.ptxVersion >= 90 && CUDART_VERSION >= 12000, hopper,
                             multiprocessors};
    }
    *facts = cached;
    return cudaSuccess;
}

// Which kernel a call runs: DAY87_FAST_KERNEL=persistent (version 3) or wmma (version 1)
// forces one, and unset (or auto) lets chooseLaunch choose. It is read at every call, so
// that one process can time both (fast/bench/bench.py); a CUDA graph keeps the kernel it
// captured. Any other value is refused (kernelSwitchProblem), by name where it once
// forced a version that the package no longer holds.
enum class KernelSwitch { kAuto, kPersistent, kWmma, kRefused };

KernelSwitch kernelSwitch() {
    const char* value = std::getenv("DAY87_FAST_KERNEL");
    if (value == nullptr || !std::strcmp(value, "") || !std::strcmp(value, "auto"))
        return KernelSwitch::kAuto;
    if (!std::strcmp(value, "persistent")) return KernelSwitch::kPersistent;
    if (!std::strcmp(value, "wmma")) return KernelSwitch::kWmma;
    return KernelSwitch::kRefused;
}

// The values of DAY87_FAST_KERNEL that forced the versions the launcher does not choose,
// and where each is now: a study, built and run on its own, or the commit that last held it.
struct VersionElsewhere {
    const char* value;
    const char* where;
};
constexpr VersionElsewhere kVersionsElsewhere[] = {
    {"hopper", "version 2 (a block per tile) is a study, outside the package: build and run "
               "fast/studies/version2_hopper.cu as its opening says"},
    {"cluster", "version 4 (clusters, B multicast) left the package, no faster than version "
                "3; its source: git show 4771a90:fast/csrc/version4_cluster.cuh"},
    {"split", "version 5 (K split in a cluster) left the package, slower than version 1; its "
              "source: git show 4771a90:fast/csrc/version5_split_cluster.cuh"},
};

// Why DAY87_FAST_KERNEL cannot be honoured on the current device, or "" where it can:
// fast/csrc/binding.cpp raises with it before a launch, where the launcher itself could
// only answer an error code.
std::string kernelSwitchProblem() {
    const KernelSwitch wanted = kernelSwitch();
    const char* value = std::getenv("DAY87_FAST_KERNEL");
    if (wanted == KernelSwitch::kRefused) {
        for (const VersionElsewhere& version : kVersionsElsewhere)
            if (!std::strcmp(value, version.value))
                return std::string("DAY87_FAST_KERNEL=") + value + ": " + version.where +
                       "; this package takes persistent, wmma or auto";
        return std::string("DAY87_FAST_KERNEL must be persistent, wmma or auto; got '") + value +
               "'";
    }
    DeviceFacts facts;
    if (wanted != KernelSwitch::kPersistent || currentDeviceFacts(&facts) != cudaSuccess ||
        facts.hopper)
        return "";
    return "DAY87_FAST_KERNEL=persistent, and this device does not run version 3: it runs only "
           "on a card of capability 9.0, from code built for sm_90a with CUDA 12 or newer "
           "(fast/setup.py adds that target to every architecture list that names 9.0)";
}

// Which plan and how many splits of K a call runs: chooseLaunch (below) alone decides,
// for the launcher and for the workspace size that binding.cpp allocates.
enum class PlanChoice { kSquare, kSmallGrid, kTuring, kPersistentWide, kPersistentNarrow };

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
// The Hopper kernel, where the device runs it, takes every grid of at least as many
// 128 x 128 tiles as SMs: version 3, the persistent one. (Version 2, the same pipeline
// with a block per tile, measured level with it, within their replays' spread; version
// 4, with clusters of two blocks, level or slower: fast/NOTES.md, "The Hopper kernel:
// versions 2 and 3" and "Version 4".) Smaller grids stay with version 1's small tiles
// and split K (the Hopper kernel does not split K, and loses there; version 5, which
// added version 1's splits in the same launch through a cluster, measured slower than
// its two launches: fast/NOTES.md, "Version 5"). The wide tile where 256 divides N and
// the wide grid takes at most half as many waves of blocks as the narrow one (a wave of
// wide tiles lasts about two of narrow ones; 2048^3: one wave of 128 wide tiles against
// two of 256 narrow ones, and the wide ones measured faster); else the narrow tile.
// Forced (DAY87_FAST_KERNEL=persistent), version 3 takes every shape, wide where N
// allows, but K = 0: a tensor map of no columns cannot be encoded, and version 1 writes
// the bias (or zeros) there.
constexpr int kMinStagesPerSplit = 2;
constexpr int kMinDepthToSplit = 256;

cudaError_t chooseLaunch(int m, int n, int k, LaunchChoice* choice) {
    DeviceFacts facts;
    const cudaError_t status = currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    const KernelSwitch wanted = kernelSwitch();
    const bool forced_hopper = wanted == KernelSwitch::kPersistent;
    if (wanted == KernelSwitch::kRefused || (forced_hopper && !facts.hopper))
        return cudaErrorInvalidValue;  // kernelSwitchProblem says why
    const int large_tiles = (m / kTileM) * (n / kTileN);
#if CUDART_VERSION >= 12000
    if (facts.hopper && wanted != KernelSwitch::kWmma && k > 0 &&
        (forced_hopper || large_tiles >= facts.multiprocessors)) {
        const auto waves = [&](int tiles) {
            return (tiles + facts.multiprocessors - 1) / facts.multiprocessors;
        };
        const bool wide = n % HopperWidePlan::kBlockN == 0 &&
                          (forced_hopper || 2 * waves(large_tiles / 2) <= waves(large_tiles));
        *choice =
            LaunchChoice{wide ? PlanChoice::kPersistentWide : PlanChoice::kPersistentNarrow, 1};
        return cudaSuccess;
    }
#endif
    choice->plan = facts.turing ? PlanChoice::kTuring
                   : large_tiles < facts.multiprocessors ? PlanChoice::kSmallGrid
                                                         : PlanChoice::kSquare;
    const bool small = choice->plan == PlanChoice::kSmallGrid;
    const int tiles = small ? (m / version1::SmallGridPlan::kBlockM) *
                                  (n / version1::SmallGridPlan::kBlockN)
                            : large_tiles;
    const int stage_depth = facts.turing ? version1::TuringPlan::kBlockK
                            : small      ? version1::SmallGridPlan::kBlockK
                                         : version1::SquarePlan::kBlockK;
    // As many splits as give every SM a block, where K is at least kMinDepthToSplit; each
    // of at least kMinStagesPerSplit stages, at most kMaxSplits; 1 is no split.
    const int k_tiles = (k + stage_depth - 1) / stage_depth;
    const int wanted_splits =
        tiles && k >= kMinDepthToSplit ? (facts.multiprocessors + tiles - 1) / tiles : 1;
    choice->splits = std::max(
        1, std::min({wanted_splits, k_tiles / kMinStagesPerSplit, version1::kMaxSplits}));
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
    return choice.splits > 1 ? choice.splits * m * n * sizeof(float) : 0;
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
    // another thread changed it since (persistent then, unset now), a split may have no
    // workspace: refused. (Where both readings split K, they split it alike: auto and
    // wmma choose version 1's plans by the same rule.)
    if (choice.splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
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
#if CUDART_VERSION >= 12000
        case PlanChoice::kPersistentWide:
            return version3::launchPersistentPlan<HopperWidePlan>(operands, facts.multiprocessors,
                                                                  stream);
        case PlanChoice::kPersistentNarrow:
            return version3::launchPersistentPlan<HopperNarrowPlan>(operands, facts.multiprocessors,
                                                                    stream);
#else
        case PlanChoice::kPersistentWide: case PlanChoice::kPersistentNarrow:
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

// fast/bench/tile_order.cu: how the persistent Hopper kernel's order of tiles was chosen.
// Version 3 (fast/csrc/version3_persistent.cuh) walks the tiles in grouped order: down
// `group_rows` rows of tiles, then across. The blocks running at one time then cover a
// region of C about group_rows tiles high, and read its rows of A and its columns of B;
// the group height decides how much of both stays in L2 between the blocks that share
// them. This times the launcher's plan at the forward's large shapes with each group
// height, with no PyTorch. (While the package held versions 2 and 4, it timed version 4
// at each height as well, and version 2 beside them: fast/NOTES.md has those figures.
// Version 2's study, fast/studies/version2_hopper.cu, times it beside version 3.)
//
// Build and run from fast/, on a Hopper card (H100, H200):
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o tile_order bench/tile_order.cu &&
//     ./tile_order
//
// Each figure is the median of 7 timings (CUDA events) of 20 launches back to back,
// on the same operands (fresh random FP16 values, never zeros), the candidates timed
// in turn (microsecondsInTurn says how), as bench/bench.py times its lines. Every order's
// output must have the same bits as the launcher's own order's (each tile's sums do
// not depend on when it runs): an order that differs is printed as a failure, and
// the exit status is 1. A failed CUDA call ends the program (CUDA_CHECK): it is a
// program of its own, where exiting is right.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../csrc/launch_policy.cu"  // versions 1 and 3 and the launcher that chooses

// Day 5's CUDA_CHECK: a failed call prints where it failed and ends the program.
#define CUDA_CHECK(call)                                                                 \
    do {                                                                                 \
        cudaError_t err = (call);                                                        \
        if (err != cudaSuccess) {                                                        \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err), __FILE__, \
                    __LINE__);                                                           \
            exit(EXIT_FAILURE);                                                          \
        }                                                                                \
    } while (0)

using Launch = cudaError_t (*)(const tuned::FastGemmOperands&, cudaStream_t, int);

template <class Plan>
cudaError_t persistent(const tuned::FastGemmOperands& operands, cudaStream_t stream,
                       int group_rows) {
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    return tuned::version3::launchPersistentPlan<Plan>(operands, facts.multiprocessors, stream,
                                                       group_rows);
}

// Microseconds per launch of each (launcher, group height), timed in turn: 7 rounds,
// each timing every one of them once, as 20 launches right after 3 untimed ones (so
// each is timed after its own work, not its neighbour's); the median of its 7
// timings.
struct Timed {
    Launch launch;
    int group_rows;
};

std::vector<float> microsecondsInTurn(const std::vector<Timed>& runs,
                                      const tuned::FastGemmOperands& operands) {
    cudaEvent_t start, end;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&end));
    std::vector<std::vector<float>> timings(runs.size());
    for (int round = 0; round < 7; ++round)
        for (size_t run = 0; run < runs.size(); ++run) {
            for (int i = 0; i < 3; ++i)
                CUDA_CHECK(runs[run].launch(operands, 0, runs[run].group_rows));
            CUDA_CHECK(cudaEventRecord(start));
            for (int i = 0; i < 20; ++i)
                CUDA_CHECK(runs[run].launch(operands, 0, runs[run].group_rows));
            CUDA_CHECK(cudaEventRecord(end));
            CUDA_CHECK(cudaEventSynchronize(end));
            float milliseconds;
            CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, end));
            timings[run].push_back(1000.0f * milliseconds / 20);
        }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(end));
    std::vector<float> medians;
    for (auto& times : timings) {
        std::sort(times.begin(), times.end());
        medians.push_back(times[times.size() / 2]);
    }
    return medians;
}

int main() {
    // The launcher's own plan for each shape: with DAY87_FAST_KERNEL set, chooseLaunch
    // would choose another (or refuse), so it is refused here first, by name.
    const char* forced = std::getenv("DAY87_FAST_KERNEL");
    if (forced != nullptr && std::strcmp(forced, "") != 0 && std::strcmp(forced, "auto") != 0) {
        printf("tile_order: DAY87_FAST_KERNEL is '%s'; unset it: this times the launcher's "
               "own plans\n", forced);
        return EXIT_FAILURE;
    }
    tuned::DeviceFacts facts;
    CUDA_CHECK(tuned::currentDeviceFacts(&facts));
    if (!facts.hopper) {
        printf("tile_order: this device runs no sm_90a code (a card of capability 9.0 and "
               "-gencode=arch=compute_90a,code=sm_90a run the Hopper kernel)\n");
        return EXIT_FAILURE;
    }
    const int shapes[][3] = {{2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 4096, 4096},
                             {8192, 8192, 8192}};
    const int group_heights[] = {1, 2, 4, 8, 16, 32};
    std::mt19937 generator(87);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    bool all_same = true;
    printf("%-22s %-26s %s\n", "M x N x K", "kernel",
           "us per launch, by group height (rows of tiles)");
    for (const auto& shape : shapes) {
        const int m = shape[0], n = shape[1], k = shape[2];
        std::vector<half> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
        for (auto& value : a) value = __float2half(normal(generator));
        for (auto& value : b) value = __float2half(normal(generator));
        tuned::FastGemmOperands operands{};
        half *device_a, *device_b;
        CUDA_CHECK(cudaMalloc(&device_a, a.size() * sizeof(half)));
        CUDA_CHECK(cudaMalloc(&device_b, b.size() * sizeof(half)));
        CUDA_CHECK(cudaMalloc(&operands.c, static_cast<size_t>(m) * n * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(device_a, a.data(), a.size() * sizeof(half), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(device_b, b.data(), b.size() * sizeof(half), cudaMemcpyHostToDevice));
        operands.a = device_a;
        operands.b = device_b;
        operands.m = m;
        operands.n = n;
        operands.k = k;

        // The launcher's own choice of plan for this shape.
        tuned::LaunchChoice choice;
        CUDA_CHECK(tuned::chooseLaunch(m, n, k, &choice));
        const bool wide = choice.plan == tuned::PlanChoice::kPersistentWide;
        const Launch launch = wide ? persistent<tuned::HopperWidePlan>
                                   : persistent<tuned::HopperNarrowPlan>;
        const size_t count = static_cast<size_t>(m) * n;
        std::vector<float> expected(count), got(count);
        CUDA_CHECK(launch(operands, 0, tuned::version3::kPersistentGroupRows));
        CUDA_CHECK(cudaMemcpy(expected.data(), operands.c, count * sizeof(float),
                              cudaMemcpyDeviceToHost));

        // Every order's bits (the same MMAs in the same order for each tile) against the
        // launcher's own order's.
        for (int group_rows : group_heights) {
            CUDA_CHECK(cudaMemset(operands.c, 0xFF, count * sizeof(float)));
            CUDA_CHECK(launch(operands, 0, group_rows));
            CUDA_CHECK(cudaMemcpy(got.data(), operands.c, count * sizeof(float),
                                  cudaMemcpyDeviceToHost));
            const bool same = std::memcmp(got.data(), expected.data(), count * sizeof(float)) == 0;
            if (!same)
                printf("group height %d: FAIL (other bits than group height %d's)\n", group_rows,
                       tuned::version3::kPersistentGroupRows);
            all_same &= same;
        }
        std::vector<Timed> runs;
        for (int group_rows : group_heights) runs.push_back(Timed{launch, group_rows});
        const std::vector<float> times = microsecondsInTurn(runs, operands);
        char label[32];
        snprintf(label, sizeof(label), "%d x %d x %d", m, n, k);
        printf("%-22s version 3, %-15s", label, wide ? "128 x 256" : "128 x 128");
        for (size_t run = 0; run < runs.size(); ++run)
            printf("  %2d: %8.1f", runs[run].group_rows, times[run]);
        printf("\n");
        CUDA_CHECK(cudaFree(device_a));
        CUDA_CHECK(cudaFree(device_b));
        CUDA_CHECK(cudaFree(operands.c));
    }
    printf("tile_order: %s\n", all_same ? "every order gave the launcher's bits" : "FAIL");
    return all_same ? EXIT_SUCCESS : EXIT_FAILURE;
}

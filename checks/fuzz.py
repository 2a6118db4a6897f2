"""fuzz.py: random calls to day87::wmma_mm, valid and invalid.

    python checks/fuzz.py N [--seed S]      # N random calls
    python checks/fuzz.py --case SEED:INDEX # rerun one call

Each call varies dtype, device (and mixes), number of dimensions, sizes (zero
included), layout (transposed, sliced, expanded, one element off alignment) and
requires_grad. It must return a result within test_op.py's error bound (its
gradients too) or raise an error that names one of the rules it breaks, as
broken_rules() below restates the contract independently of binding.cpp; after
every error on the GPU a valid call must still be right.
"""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import op  # noqa: E402
from test_op import error_ratio, forward_on_gpu, why_no_kernel  # noqa: E402


def broken_rules(a, b):
    """The contract, restated from the README: every rule this call breaks."""
    rules = []
    if a.dim() != 2 or b.dim() != 2:
        return ["two matrices"]
    if a.device != b.device:
        rules.append("one device")
    expected_dtype = torch.half if a.is_cuda else torch.float64
    if a.dtype != expected_dtype or b.dtype != expected_dtype:
        rules.append("dtype")
    if not (a.is_contiguous() and b.is_contiguous()):
        rules.append("contiguous")
    if a.shape[1] != b.shape[0]:
        rules.append("inner dimensions")
    if a.is_cuda and b.is_cuda:
        if a.shape[0] % op.TILE_M or b.shape[1] % op.TILE_N or a.shape[1] % op.TILE_K:
            rules.append("tile")
        if a.data_ptr() % 16 or b.data_ptr() % 16:
            rules.append("alignment")
    return rules


def draw_call(rng, devices):
    """One random call: (a, b, output gradient or None, description)."""
    device = rng.choice(devices)
    on_cuda = device == "cuda"
    # On CUDA, multiples of the tile (op.TILE_M, TILE_N, TILE_K), zero included. In
    # kernel.cu's terms: K of 1, 3 or 17 WMMA steps leaves the last 32-deep stage
    # half full, and 17 steps are more stages than the pipeline holds, so its
    # buffers wrap; M of 10 tiles spans two groups of 8 block-rows, the second partial.
    m = op.TILE_M * rng.choice([0, 1, 2, 3, 10]) if on_cuda else rng.choice([0, 1, 3, 17, 64])
    k = op.TILE_K * rng.choice([0, 1, 3, 8, 17]) if on_cuda else rng.choice([0, 1, 5, 32])
    n = op.TILE_N * rng.choice([0, 1, 2]) if on_cuda else rng.choice([0, 1, 4, 33])
    dtype = torch.half if on_cuda else torch.float64
    shape_a, shape_b, notes = [m, k], [k, n], []
    devices_ab = [device, device]
    dtypes_ab = [dtype, dtype]
    # Each perturbation breaks (or, by chance, keeps) one thing a tensor carries.
    if rng.random() < 0.15:
        side = rng.randrange(2)
        dtypes_ab[side] = rng.choice([torch.float16, torch.float32, torch.float64, torch.bfloat16,
                                      torch.int32])
        notes.append(f"{'ab'[side]} dtype {dtypes_ab[side]}")
    if rng.random() < 0.1 and len(devices) > 1:
        side = rng.randrange(2)
        devices_ab[side] = rng.choice(devices)
        notes.append(f"{'ab'[side]} on {devices_ab[side]}")
    if rng.random() < 0.15:
        side = rng.randrange(2)
        (shape_a, shape_b)[side][rng.randrange(2)] += rng.choice([-1, 1, 8, 16])
        notes.append(f"{'ab'[side]} size changed")
    ndims = [2, 2]
    if rng.random() < 0.08:
        side = rng.randrange(2)
        ndims[side] = rng.choice([0, 1, 3])
        notes.append(f"{'ab'[side]} {ndims[side]}-D")
    layouts = [rng.choice(["contiguous"] * 6 + ["transposed", "column slice", "row slice",
                                                "expanded", "offset"]) for _ in range(2)]
    tensors = []
    for side in range(2):
        shape = [max(size, 0) for size in (shape_a, shape_b)[side]]
        shape = {0: [], 1: shape[:1], 2: shape, 3: [2] + shape}[ndims[side]]
        tensors.append(make_tensor(shape, dtypes_ab[side], devices_ab[side], layouts[side], rng))
        if layouts[side] != "contiguous":
            notes.append(f"{'ab'[side]} {layouts[side]}")
    a, b = tensors
    if rng.random() < 0.4 and a.dtype.is_floating_point and b.dtype.is_floating_point:
        a.requires_grad_(rng.random() < 0.8)
        b.requires_grad_(rng.random() < 0.8)
        if a.requires_grad or b.requires_grad:
            notes.append("requires_grad")
    return a, b, notes


def make_tensor(shape, dtype, device, layout, rng):
    def values(shape):
        return torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device) \
            if dtype.is_floating_point else torch.randint(-3, 4, shape, dtype=dtype, device=device)

    if len(shape) != 2 or layout == "contiguous":
        return values(shape)
    rows, cols = shape
    if layout == "transposed":
        return values([cols, rows]).t()
    if layout == "column slice":
        return values([rows, cols + 16])[:, 16:]
    if layout == "row slice":  # contiguous, 16-byte aligned when cols is a multiple of 8
        return values([rows + 1, cols])[1:]
    if layout == "expanded":
        return values([1, cols]).expand(rows, cols)
    flat = values([rows * cols + 1])  # "offset": contiguous, one element off alignment
    return flat[1:].view(rows, cols)


def fuzz_one(seed, index, devices, mm=op.wmma_mm):
    """Run call `index` of `seed`: returns ("result" or "raised", None) when the
    op kept its contract, or ("fail", a description of what went wrong)."""
    rng = random.Random(f"{seed}:{index}")
    torch.manual_seed(rng.randrange(2**31))
    a, b, notes = draw_call(rng, devices)
    describe = (f"a {tuple(a.shape)} {a.dtype} {a.device} stride {a.stride()}, "
                f"b {tuple(b.shape)} {b.dtype} {b.device} stride {b.stride()} "
                f"({', '.join(notes) or 'plain'})")
    broken = broken_rules(a, b)
    try:
        c = mm(a, b)
    except (RuntimeError, ValueError, TypeError) as error:
        if not broken:
            return "fail", (f"valid call raised {type(error).__name__}: "
                            f"{str(error).splitlines()[0]} | {describe}")
        if not any(f"'{rule}'" in str(error) for rule in broken):
            return "fail", (f"error names none of {broken}: "
                            f"{str(error).splitlines()[0]} | {describe}")
        if a.is_cuda or b.is_cuda:  # after an error the CUDA context must still work
            try:
                forward_on_gpu(mm, op.TILE_M, op.TILE_N, op.TILE_K)
            except Exception as error:
                return "fail", f"CUDA context broken after the error: {error} | {describe}"
        return "raised", None
    if broken:
        return "fail", f"returned a result though it breaks {broken} | {describe}"
    ratio = error_ratio(c, a, b)
    if ratio > 1.0:
        return "fail", f"forward error {100 * ratio:.3g}% of bound | {describe}"
    if c.requires_grad:
        grad = torch.randn_like(c)
        c.backward(grad)
        # Each gradient is itself a product, grad @ b^T or (grad^T @ a)^T, in the
        # output's dtype and rounded to its input's (op.py's backward): within
        # error_ratio's bound, which allows for that rounding.
        for name, got, left, right in (("grad_a", a.grad, grad, b.t()),
                                       ("grad_b", b.grad, grad.t(), a)):
            if got is not None:
                got = got if name == "grad_a" else got.t()
                ratio = error_ratio(got, left.to(c.dtype), right.to(c.dtype))
                if ratio > 1.0:
                    return "fail", f"{name} error {100 * ratio:.3g}% of bound | {describe}"
    return "result", None


def run_fuzz(count, seed, only_index=None):
    devices = ["cpu"] if why_no_kernel() else ["cpu", "cuda"]
    print(f"fuzz: seed {seed}, {count} calls, devices {devices}", flush=True)
    tally = {"result": 0, "raised": 0, "fail": 0}
    indices = [only_index] if only_index is not None else range(count)
    for index in indices:
        status, problem = fuzz_one(seed, index, devices)
        tally[status] += 1
        if problem:
            print(f"FAIL call {index}: {problem}\n"
                  f"    reproduce: python checks/fuzz.py --case {seed}:{index}", flush=True)
    print(f"fuzz: {tally['result']} calls returned a result within the bound, "
          f"{tally['raised']} raised an error naming a broken rule "
          "(each followed by a valid CUDA call where CUDA was involved)")
    print(f"{tally['result'] + tally['raised']} passed, {tally['fail']} failed, 0 skipped")
    return tally["fail"] == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("count", type=int, nargs="?", default=1000, help="how many calls")
    parser.add_argument("--seed", type=int, default=None,
                        help="the seed (default: random, printed)")
    parser.add_argument("--case", metavar="SEED:INDEX", help="rerun one call")
    args = parser.parse_args()
    if args.case:
        seed, index = (int(part) for part in args.case.split(":"))
        sys.exit(0 if run_fuzz(1, seed, index) else 1)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    sys.exit(0 if run_fuzz(args.count, seed) else 1)


if __name__ == "__main__":
    main()

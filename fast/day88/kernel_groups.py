"""kernel_groups.py: a torch.profiler trace of training steps, its time put in six groups.

    from day88 import kernel_groups      (from fast/)
    profile = kernel_groups.grouped(profiler.events(), on_gpu=True, steps=3)
    profile.groups["GEMMs"]              # microseconds per step

On a GPU, the unit is a kernel (or a memory copy or fill) and its GPU time; on the CPU,
where there are no kernels, an operator and its own CPU time (its children's taken out).
Each unit is named by what launched it: the chain of operators from the innermost one that
was running when it started, out to the step. The rules, in order, the first that holds
deciding:

- optimizer: inside the step's OPTIMIZER_SCOPE (train.py names it): GradScaler's unscaling
  and check for infinities, AdamW's update, the scale's update;
- other, for attention (flash, memory-efficient or cuDNN's): its kernels are built from
  CUTLASS's templates or wgmma, so their names would read as GEMMs;
- GEMMs: cuBLAS's kernels, the lesson's and day87_fast's, Triton's matmul templates;
- an Inductor kernel (torch.compile's), fused from several operators and named after them
  (triton_poi_fused__to_copy_add_gelu_3), goes by the first of these it holds: a layer
  norm, softmax, loss or embedding (other); an add, GELU or sum (bias and activation); a
  clone (copies, a cast fused into the copy included); a cast (casts); else other;
- casts: anything inside aten::_to_copy (autocast's casts and .to(dtype)), day87_fast's
  scaleToHalfKernel (its backward's FP32 gradient scaled into FP16, launched by the
  backward's operator);
- GEMMs too: a unit whose innermost operator is a product (a cuBLAS kernel without a
  GEMM's name, such as a split-K reduction; on the CPU, the product itself);
- copies: inside copy_, clone or contiguous (a layout copy such as the lesson variant's
  weight.t().contiguous()), a memory copy;
- bias and activation: element-wise adds (the bias, the residual stream, gradients summed),
  GELU and its backward, the sums that give the bias's gradient;
- other: the rest (layer norms, the loss, the embeddings, attention, the data's gather).

So that a reader can check each decision, `grouped` keeps every unit's name and group.
"""

import re
from typing import NamedTuple

from torch.autograd import DeviceType

GROUPS = ("GEMMs", "copies", "casts", "bias and activation", "optimizer", "other")
OPTIMIZER_SCOPE = "optimizer"  # train.py's record_function around the optimizer's step

# Each name is searched for (re.search), case-sensitively unless it says otherwise.
ATTENTION = re.compile(r"flash|fmha|attention|sdpa", re.IGNORECASE)
GEMM_KERNELS = re.compile(
    r"gemm|gemv|nvjet|xmma|cutlass|triton_tem_"  # cuBLAS's families, Inductor's templates
    r"|wmmaGemmKernel|splitSumKernel|hopperPersistentKernel")  # kernel.cu's, csrc/'s
PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm",
            "day87::wmma_mm", "day87_fast::wmma_mm", "day87_fast::wmma_mm_bias",
            "day87_fast::wmma_mm_backward"}
# Inductor's pointwise, persistent-reduction and reduction kernels: the operators fused
INDUCTOR_KERNEL = re.compile(r"^triton_(?:poi|per|red)_fused_(\w+)_\d+$")
FUSED_GROUPS = [(re.compile(r"layer_norm|softmax|nll_loss|embedding"), "other"),
                (re.compile(r"add|gelu|sum"), "bias and activation"),
                (re.compile(r"clone"), "copies"),
                (re.compile(r"_to_copy"), "casts")]
CAST_KERNELS = re.compile(r"scaleToHalfKernel")
COPY_OPERATORS = {"aten::copy_", "aten::clone", "aten::contiguous"}
COPY_KERNELS = re.compile(r"^Memcpy")
BIAS_AND_ACTIVATION_OPERATORS = {"aten::add", "aten::add_", "aten::gelu",
                                 "aten::gelu_backward", "aten::sum"}


def group_of(name, chain):
    """The group of a unit named `name` (a kernel's, or on the CPU the operator's own), whose
    launching operators, innermost first, are `chain` (names)."""
    innermost = chain[0] if chain else ""
    if OPTIMIZER_SCOPE in chain:
        return "optimizer"
    if ATTENTION.search(name) or any(ATTENTION.search(operator) for operator in chain):
        return "other"
    if GEMM_KERNELS.search(name):
        return "GEMMs"
    if fused := INDUCTOR_KERNEL.match(name):
        return next((group for pattern, group in FUSED_GROUPS if pattern.search(fused[1])),
                    "other")
    if CAST_KERNELS.search(name) or "aten::_to_copy" in chain:
        return "casts"
    if innermost in PRODUCTS:
        return "GEMMs"
    if COPY_KERNELS.search(name) or innermost in COPY_OPERATORS:
        return "copies"
    if innermost in BIAS_AND_ACTIVATION_OPERATORS:
        return "bias and activation"
    return "other"


class Unit(NamedTuple):
    """One kernel (or operator, on the CPU) by name: its calls and time per step."""
    name: str
    group: str
    calls: float
    microseconds: float


class Profile(NamedTuple):
    """Per step: each group's microseconds, the units launched, and every unit by time."""
    groups: dict
    launches: float
    units: list


def chain_of(event):
    """The names of `event` and its parents, innermost first ([] for no event)."""
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return names


def timed_units(events, on_gpu):
    """(name, microseconds, chain) for each unit of a profiler's events.

    On a GPU: each device event (a kernel, a memory copy or fill), user annotations left
    out, as torch's own tables leave them out of the device total; its launcher is the
    operator whose id is the event's linked correlation id. On the CPU: each operator's
    own time."""
    if not on_gpu:
        return [(event.name, event.self_cpu_time_total, chain_of(event)) for event in events
                if event.device_type == DeviceType.CPU and not event.is_async]
    # Operators only: a launch call (cudaLaunchKernel) is linked to an operator, not one.
    launchers = {event.id: event for event in events if event.device_type == DeviceType.CPU
                 and not event.is_async and event.linked_correlation_id == 0}
    return [(event.name, event.device_time_total,
             chain_of(launchers.get(event.linked_correlation_id)))
            for event in events
            if event.device_type == DeviceType.CUDA and not event.is_user_annotation]


def grouped(events, on_gpu, steps):
    """A Profile of `steps` profiled steps' events, each figure divided by `steps`."""
    totals, calls = {}, {}
    for name, microseconds, chain in timed_units(events, on_gpu):
        key = (name, group_of(name, chain))
        totals[key] = totals.get(key, 0.0) + microseconds
        calls[key] = calls.get(key, 0) + 1
    per_group = {group: 0.0 for group in GROUPS}
    for (name, group), microseconds in totals.items():
        per_group[group] += microseconds / steps
    units = sorted((Unit(name, group, calls[name, group] / steps, microseconds / steps)
                    for (name, group), microseconds in totals.items()),
                   key=lambda unit: -unit.microseconds)
    return Profile(per_group, sum(calls.values()) / steps, units)

"""test_day88.py: day88/'s parts on the CPU: the kernel groups' rules, the profile's
bookkeeping, the picture, the corpus, the checks, and a planted wrong layer that the
loss check must catch (day87_fast installed; no GPU).

    cd fast && python -m pytest -q tests/test_day88.py
"""

import math
import types
import xml.etree.ElementTree as ElementTree

import pytest
import torch

from day88 import kernel_groups, model, picture, train

SVG = "{http://www.w3.org/2000/svg}"
COPY_KERNEL = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
               "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)")


@pytest.mark.parametrize("name, chain, group", [
    # cuBLAS's kernels on Hopper, and the operators' own
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNT", ["aten::mm"], "GEMMs"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", ["aten::addmm"], "GEMMs"),
    ("wmmaGemmKernel(GemmOperands)", ["day87::wmma_mm"], "GEMMs"),
    ("void hopperPersistentKernel<HopperPlan>(CUtensorMap, CUtensorMap, FastGemmOperands, int)",
     ["day87_fast::wmma_mm_bias"], "GEMMs"),
    # a kernel with no GEMM name launched by a product is the product's
    ("splitKreduce_kernel", ["aten::mm", "MmBackward0"], "GEMMs"),
    ("triton_tem_fused_mm_4", ["CompiledFunction"], "GEMMs"),
    # the same copy kernel: a cast inside _to_copy, a layout copy inside clone
    (COPY_KERNEL, ["aten::copy_", "aten::_to_copy", "aten::to", "aten::linear"], "casts"),
    (COPY_KERNEL, ["aten::copy_", "aten::clone", "aten::contiguous"], "copies"),
    ("scaleToHalfKernel(StridedMatrix, float*, half*, float*, int)",
     ["day87_fast::wmma_mm_backward"], "casts"),
    ("triton_poi_fused__to_copy_3", [], "casts"),
    ("Memcpy DtoD (Device -> Device)", [], "copies"),
    ("triton_poi_fused_clone_2", [], "copies"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl",
     ["aten::gelu"], "bias and activation"),
    ("void at::native::reduce_kernel<512, 1>", ["aten::sum", "AddmmBackward0"],
     "bias and activation"),
    # Inductor's fused kernels, by the operators they hold
    ("triton_poi_fused_add_gelu_5", [], "bias and activation"),
    ("triton_poi_fused__to_copy_add_gelu_3", [], "bias and activation"),
    ("triton_poi_fused__to_copy_clone_t_0", [], "copies"),
    ("triton_red_fused__to_copy_sum_1", [], "bias and activation"),
    ("triton_poi_fused_mul_view_6", [], "other"),
    # attention's kernels are CUTLASS templates: other, not GEMMs
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
     "cutlass::half_t>>", ["aten::_flash_attention_forward"], "other"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64",
     ["aten::_scaled_dot_product_cudnn_attention"], "other"),
    ("triton_per_fused_add_native_layer_norm_7", [], "other"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
     ["aten::native_layer_norm"], "other"),
    # inside the step's optimizer scope, whatever the kernel
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     ["aten::_fused_adamw_", "Optimizer.step#AdamW.step", kernel_groups.OPTIMIZER_SCOPE],
     "optimizer"),
    (COPY_KERNEL, ["aten::copy_", "aten::_to_copy", kernel_groups.OPTIMIZER_SCOPE],
     "optimizer"),
])
def test_each_rule_decides_its_group(name, chain, group):
    assert kernel_groups.group_of(name, chain) == group


def event(name, device_type, **fields):
    defaults = {"id": 0, "linked_correlation_id": 0, "is_async": False,
                "is_user_annotation": False, "cpu_parent": None, "device_time_total": 0.0,
                "self_cpu_time_total": 0.0}
    return types.SimpleNamespace(name=name, device_type=device_type, **{**defaults, **fields})


def test_gpu_units_are_device_events_named_by_their_launchers():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    linear = event("aten::linear", cpu, id=1)
    to_copy = event("aten::_to_copy", cpu, id=2, cpu_parent=linear)
    copy = event("aten::copy_", cpu, id=3, cpu_parent=to_copy)
    matmul = event("aten::mm", cpu, id=4, cpu_parent=linear)
    launch = event("cudaLaunchKernel", cpu, id=9, linked_correlation_id=3)  # not an operator
    events = [linear, to_copy, copy, matmul, launch,
              event(COPY_KERNEL, cuda, linked_correlation_id=3, device_time_total=4.0),
              event(COPY_KERNEL, cuda, linked_correlation_id=3, device_time_total=6.0),
              event("nvjet_hsh_128x128", cuda, linked_correlation_id=4, device_time_total=30.0),
              # a record_function's span on the GPU: not a kernel, left out
              event("optimizer", cuda, is_user_annotation=True, device_time_total=500.0)]
    profile = kernel_groups.grouped(events, on_gpu=True, steps=2)
    assert profile.groups["casts"] == 5.0 and profile.groups["GEMMs"] == 15.0
    assert sum(profile.groups.values()) == 20.0
    assert profile.launches == 1.5  # three device events in two steps
    assert profile.units[0] == kernel_groups.Unit("nvjet_hsh_128x128", "GEMMs", 0.5, 15.0)
    assert profile.units[1] == kernel_groups.Unit(COPY_KERNEL, "casts", 1.0, 5.0)


def test_a_cpu_profile_puts_products_and_the_optimizer_in_their_groups():
    layer = torch.nn.Linear(16, 8).double()
    optimizer = torch.optim.AdamW(layer.parameters(), fused=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        layer(torch.randn(4, 16, dtype=torch.float64)).square().sum().backward()
        with torch.profiler.record_function(kernel_groups.OPTIMIZER_SCOPE):
            optimizer.step()
    profile = kernel_groups.grouped(profiler.events(), on_gpu=False, steps=1)
    assert profile.groups["GEMMs"] > 0 and profile.groups["optimizer"] > 0
    groups_of = {unit.name: unit.group for unit in profile.units}
    assert groups_of["aten::addmm"] == "GEMMs" and groups_of["aten::mm"] == "GEMMs"
    assert groups_of["aten::_fused_adamw_"] == "optimizer"
    assert math.isclose(sum(profile.groups.values()),
                        sum(unit.microseconds for unit in profile.units))


def test_the_picture_stacks_each_group_beside_the_wall_time():
    groups = {"GEMMs": 3.0, "copies": 1.0, "casts": 0.0, "bias and activation": 2.0,
              "optimizer": 0.5, "other": 1.5}
    document = picture.training_svg("run", "GPU", [
        picture.Drawn("torch", groups, 10.0, [4.0, 3.0, 2.5]),
        picture.Drawn("fast-compiled", None, 5.0, [4.0, 3.1, 2.4])])
    root = ElementTree.fromstring(document)
    bars = {rect.find(SVG + "title").text: float(rect.get("height"))
            for rect in root.iter(SVG + "rect") if rect.find(SVG + "title") is not None}
    # one bar per group with time (casts has none), one wall bar per variant
    assert sorted(bars) == sorted([f"torch: {group} {value:.3f} ms"
                                   for group, value in groups.items() if value] +
                                  ["torch: wall 10.000 ms", "fast-compiled: wall 5.000 ms"])
    stacked = sum(height for title, height in bars.items()
                  if title.startswith("torch:") and "wall" not in title)
    assert math.isclose(stacked, bars["torch: wall 10.000 ms"] * 0.8, abs_tol=0.2)
    assert math.isclose(bars["torch: GEMMs 3.000 ms"], 3 * bars["torch: copies 1.000 ms"],
                        abs_tol=0.2)
    # stacked in GROUPS' order from the axis up: each bar's foot on the one before's top
    spans = [(float(rect.get("y")), float(rect.get("height"))) for rect in root.iter(SVG + "rect")
             if (rect.findtext(SVG + "title") or "").startswith("torch:")
             and "wall" not in rect.findtext(SVG + "title")]
    feet = [top + height for top, height in spans]
    assert math.isclose(feet[0], picture.BOTTOM, abs_tol=0.1)
    assert all(math.isclose(foot, top, abs_tol=0.2)
               for foot, (top, _) in zip(feet[1:], spans))
    curves = {line.find(SVG + "title").text: line for line in root.iter(SVG + "polyline")}
    assert sorted(curves) == ["fast-compiled", "torch"]
    assert len(curves["torch"].get("points").split()) == 3
    assert curves["fast-compiled"].get("stroke-dasharray") == picture.COMPILED_DASH
    assert curves["torch"].get("stroke-dasharray") is None


def test_the_picture_refuses_a_negative_time():
    with pytest.raises(ValueError, match="rule 'picture'.*torch"):
        picture.training_svg("run", "GPU", [picture.Drawn("torch", {"GEMMs": -1.0}, 1.0, [1.0])])


def test_the_corpus_is_the_named_folders_markdown_and_python(tmp_path):
    files = {"README.md": "aaaaa", "op.py": "ddddd", "checks/NOTES.md": "bbbbb",
             "fast/bench/x.py": "ccccc", "fast/build/lib/copy.py": "NO", "fast/.hidden/a.md": "NO",
             "checks/x.log": "NO", "shared/MACHINES.md": "NO", "fast/src/p.egg-info/PKG.md": "NO"}
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    paths = [str(path.relative_to(tmp_path)) for path in model.corpus_paths(tmp_path)]
    assert paths == ["README.md", "checks/NOTES.md", "fast/bench/x.py", "op.py"]
    corpus = model.read_corpus(tmp_path)
    assert corpus.characters == "abcd" and corpus.files == 4
    # 20 characters in path order: the last tenth, "dd", held out
    assert corpus.train.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 3
    assert corpus.validation.tolist() == [3, 3]


def result(name, losses, validation):
    return train.Result(name, losses=losses, validation=validation)


def test_the_checks_name_each_rule_broken():
    tolerance = train.Tolerance(step=1e-3, validation=1e-3)
    torch_run = result("torch", [4.0, 3.0], (4.0, 3.0))
    assert train.failed_checks([torch_run, result("fast", [4.0, 3.0 * (1 + 5e-4)], (4.0, 3.0))],
                               tolerance) == []
    failures = train.failed_checks([torch_run, result("fast", [4.0, 3.01], (4.0, 3.0)),
                                    result("lesson", [4.0, 3.0], (4.0, 3.9))], tolerance)
    assert len(failures) == 3
    assert failures[0].startswith("fast: rule 'equal to torch': its loss at step 2 is 3.01")
    assert failures[1].startswith("lesson: rule 'the loss falls': validation loss 3.9")
    assert failures[2].startswith("lesson: rule 'equal to torch': validation loss 3.9")


class ColumnMajorReadAsRowMajor(torch.nn.Linear):
    """A planted bug: the weight, kept (out, in), read as if it were b (in, out) row-major:
    the column-major b read as row-major."""

    def forward(self, x):
        return x @ self.weight.reshape(self.in_features, self.out_features) + self.bias


def run_torch_and_fast(monkeypatch, fast_layer):
    config = train.CONFIGS["cpu"]._replace(steps=3, timed=1, host=1, profiled=1,
                                           validation_batches=1)
    layers = {"torch": torch.nn.Linear, "fast": fast_layer}
    monkeypatch.setattr(model, "linear_layer", layers.__getitem__)
    corpus = model.read_corpus()
    state = train.initial_weights(config, corpus.vocabulary)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as train.py's CPU run has it (its run() says why)
    try:
        results = [train.train_variant(name, config, corpus, state, torch.device("cpu"),
                                       profile=False, traces=None) for name in ("torch", "fast")]
    finally:
        torch.set_num_threads(threads)
    return [failure for failure in train.failed_checks(results, train.TOLERANCES["cpu"])
            if "equal to torch" in failure]


def test_day87_fast_linear_trains_as_nn_linear(monkeypatch):
    assert run_torch_and_fast(monkeypatch, model.day87_fast.Linear) == []


def test_a_planted_wrong_layer_fails_the_loss_check(monkeypatch):
    failures = run_torch_and_fast(monkeypatch, ColumnMajorReadAsRowMajor)
    assert failures and failures[0].startswith("fast: rule 'equal to torch': its loss at step")

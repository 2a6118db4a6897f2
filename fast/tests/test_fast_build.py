"""test_fast_build.py: what the fast operator's build adds to the lesson's.

    cd fast && python -m pytest tests/test_fast_build.py

The lesson's build checks (keyed folders, locks, toolchain messages, ...) are
checks/test_build.py's, and this folder's build is the lesson's: only what differs
is checked here. The sm_90a target that the Hopper kernels (versions 2 to 4) need is added
where a Hopper card may run the build, and only there. fast/csrc/binding.cpp needs cuBLAS's
headers, which the lesson does not, and a toolkit without them, with no nvidia wheels
to take them from, must be refused before compiling, the headers named.
"""

import os
import shutil

import pytest
import torch

from tests.lesson_folder import LESSON  # and checks/ importable, for test_build.py
from test_build import copy_lesson, import_op, make_fake_toolkit, succeeded  # noqa: E402

FAST = os.path.join(LESSON, "fast")


@pytest.mark.skipif(not torch.version.cuda, reason="torch has no CUDA: no toolkit is looked for")
def test_toolkit_without_cublas_headers(tmp_path):
    folder = copy_lesson(tmp_path / "no-cublas")
    shutil.copytree(FAST, os.path.join(folder, "fast"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    # The lesson first, with the real toolkit: its cached build then loads whatever
    # toolkit is named next, and only the fast operator's build is left to refuse.
    succeeded(import_op(folder, cache), "the lesson's build")
    fake_toolkit = make_fake_toolkit(tmp_path / "minimal-cuda", torch.version.cuda)
    # torch first (its own import may use the wheels), then the wheels hidden from day87_fast.
    refused = import_op(folder, cache, CUDA_HOME=str(fake_toolkit),
                        PYTHONPATH=os.path.join(folder, "fast"),
                        code="import sys, torch; sys.modules['nvidia'] = None; import day87_fast")
    message = refused.stderr
    assert (refused.returncode != 0 and "cublas_v2.h" in message
            and "day87: building" not in message), \
        f"a toolkit without cuBLAS's headers: {message[-300:]}"


@pytest.mark.skipif(not torch.version.cuda, reason="torch has no CUDA: nothing is built for a card")
def test_hopper_target_where_a_hopper_card_may_run():
    # The Hopper kernels need the sm_90a target, which no list that torch
    # derives names: day87_fast adds it to the lesson's list where that names 9.0 (a
    # Hopper card visible, or none: CI's list), and only there; the list's own stay.
    import day87_fast as fast
    hopper = ((fast.HOPPER_ARCHITECTURE,) if int(torch.version.cuda.split(".")[0]) >= 12
              else ())
    assert fast.hopper_architectures("7.5;8.0;8.6;8.9;9.0+PTX") == hopper, \
        "no card visible: every architecture"
    assert fast.hopper_architectures("9.0+PTX") == hopper, "an H100 or H200 visible"
    assert fast.hopper_architectures("8.0;9.0") == hopper, "TORCH_CUDA_ARCH_LIST naming 9.0"
    assert fast.hopper_architectures("9.0a") == (), "the list has it already"
    assert fast.hopper_architectures("7.5+PTX") == (), \
        "the T4's code, asked for: what runs must be it"
    assert fast.hopper_architectures("8.0+PTX") == (), \
        "an A100 visible: no Hopper card to run it"
    lesson_archs = fast.op.BUILD["archs"]
    assert fast.BUILD["archs"] == ";".join(
        [lesson_archs, *fast.hopper_architectures(lesson_archs)]), \
        f"the fast build's architectures: {fast.BUILD['archs']}, the lesson's: {lesson_archs}"
    # And cpp_extension compiled every one of them: a flag that names an architecture
    # among nvcc's own would make it drop the list's.
    if not fast.BUILD["with_cuda"]:
        pytest.skip("no CUDA toolkit found: the build is the CPU part only, "
                    "and compiles no architecture")
    ninja = open(os.path.join(fast.BUILD["directory"], "build.ninja")).read()
    for name in fast.BUILD["archs"].split(";"):
        number = name.split("+")[0].replace(".", "")
        assert f"arch=compute_{number},code=sm_{number}" in ninja, \
            f"no sm_{number} code in {ninja[:2000]}"

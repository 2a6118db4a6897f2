"""test_aoti.py: an AOTInductor package of day87::wmma_mm, compiled, loaded and run on a GPU.

    python -m pytest checks/test_aoti.py          # skips without a GPU

AOTInductor compiles the package's C++ with the compiler that CXX names (else g++). One that
links its own libstdc++ into what it builds (the H200 image's CXX does) makes the package
segfault as it loads; README's pitfall row gives the fix, which the test applies where op.py's
probe finds such a compiler: CXX=/usr/bin/g++ for the process that compiles the package.
"""

import os
import subprocess
import sys

import pytest
import torch

import op
from test_build import LESSON, environment

PACKAGE = """
import sys, torch, op


class Layer(torch.nn.Module):  # the op inside a model, as day 88 uses it
    def forward(self, a, b):
        return torch.relu(op.wmma_mm(a, b))


def inputs():
    return (torch.randn(256, 384, dtype=torch.half, device="cuda"),
            torch.randn(384, 512, dtype=torch.half, device="cuda"))


program = torch.export.export(Layer(), inputs())
path = torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[1])
package = torch._inductor.aoti_load_package(path)
a, b = inputs()  # fresh values: the package must compute, not replay
print("equal to eager:", torch.equal(package(a, b), Layer()(a, b)))
"""


@pytest.mark.skipif(not (torch.cuda.is_available() and op.BUILD["with_cuda"]),
                    reason="needs a GPU and the extension's CUDA part")
def test_aoti_package_of_the_op(tmp_path):
    compiler = os.environ.get("CXX", "g++")  # inductor's choice
    fix = {"CXX": "/usr/bin/g++"} if op.needs_libstdcxx(compiler) is False else {}
    result = subprocess.run([sys.executable, "-c", PACKAGE, str(tmp_path / "wmma_mm.pt2")],
                            cwd=LESSON, env=environment(os.environ.get("TORCH_EXTENSIONS_DIR",
                                                                       tmp_path / "cache"), **fix),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"exit {result.returncode} (CXX {fix or compiler}): " \
                                   f"{result.stderr.strip()[-800:]}"
    assert result.stdout.strip().endswith("equal to eager: True"), result.stdout[-400:]

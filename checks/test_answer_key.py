"""pytest: the exercise solved (no GPU needed): the answer key laid over a fresh copy of
the lesson, or, in a folder where the exercise is solved, that folder's own solution.

checks/answer_key.patch is a full solution of day87::wmma_mm_bias, for after the
attempt. Here checks/solved.py makes the solved copy of the seven files (and of
checks/), and on it check 6's CPU rows pass, the second operator names itself in its
errors, the gate compiles with its bias cases and the self-test passes (grading the
copy's own wmma_mm_bias as well). A change to a lesson file that the key no longer
applies to, or that the solved copy no longer passes, fails here.
"""
import os
import subprocess
import sys

import pytest

from solved import solved_copy
from test_build import environment

NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A solved copy of the lesson (checks/solved.py), and a build cache of its own."""
    folder = tmp_path_factory.mktemp("solved")
    print(f"solved copy: {solved_copy(str(folder))}")
    return folder, tmp_path_factory.mktemp("solved-cache")


def run(solved, *command):
    folder, cache = solved
    return subprocess.run([sys.executable, *command], cwd=folder, env=environment(cache),
                          capture_output=True, text=True, timeout=1800)


def test_check_6_passes_on_the_solved_copy(solved):
    result = run(solved, "test_op.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1500:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("6 exercise")]
    for question in ("forward", "gradient", "fake"):
        assert any(line.startswith(f"6 exercise: {question}") and " pass, " in line for line in rows), rows
    assert any(line.startswith("6 exercise: cuda forward") for line in rows), rows
    assert any(line.startswith("6 exercise: cuda gradient") for line in rows), rows


def test_the_second_operator_names_itself_in_its_errors(solved):
    """binding.cpp's contract and op.py's fake take the operator's name: a broken rule
    of wmma_mm_bias, eager or compiled, says wmma_mm_bias, not wmma_mm."""
    probe = ("import torch, op\n"
             "a, b, bias = torch.randn(4, 3, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64), "
             "torch.randn(5, dtype=torch.float64)\n"
             "for call in (op.wmma_mm_bias, torch.compile(op.wmma_mm_bias, backend='aot_eager', fullgraph=True)):\n"
             "    try:\n"
             "        call(a, b, bias)\n"
             "    except Exception as error:\n"
             "        print([line for line in str(error).splitlines() if 'rule' in line][0])\n")
    result = run(solved, "-c", probe)
    assert result.returncode == 0, result.stderr[-1500:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all("day87::wmma_mm_bias: rule 'inner dimensions'" in line for line in lines), lines


def test_the_self_test_passes_on_the_solved_copy(solved):
    result = run(solved, "checks/self_test.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1500:]
    own = [line for line in result.stdout.splitlines() if line.startswith("this folder's wmma_mm_bias")]
    assert len(own) == 7 and all(" FAIL, " not in line for line in own), own  # check 6's seven rows


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_the_gate_compiles_with_its_bias_cases(solved):
    folder, _ = solved
    assert "with_bias" in (folder / "gate.cu").read_text()
    result = subprocess.run([NVCC, "-O0", "-gencode", "arch=compute_75,code=sm_75", "-o", str(folder / "gate"),
                             str(folder / "gate.cu")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]

"""pytest: the exercise's answer key, laid over a fresh copy of the lesson (no GPU needed).

checks/answer_key.patch is a full solution of day87::wmma_mm_bias, for after the
attempt. Here it is applied to a copy of the seven files (and of checks/), and on
that solved copy check 6's CPU rows pass, the gate compiles with its bias cases,
the self-test passes (grading the copy's own wmma_mm_bias as well) and the variant
tool's generated calls still compile. A change to a lesson file that the key no
longer applies to, or that the solved copy no longer passes, fails here.
"""
import os
import shutil
import subprocess
import sys

import pytest

from test_build import environment
from test_forward_variants import NVCC, compile_variants

LESSON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = os.path.join(LESSON, "checks", "answer_key.patch")
SEVEN_FILES = ("kernel.cu", "binding.cpp", "op.py", "test_op.py", "gate.cu", "README.md", "requirements.txt")


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A copy of the lesson with the answer key applied, and a build cache of its own."""
    folder = tmp_path_factory.mktemp("solved")
    for name in SEVEN_FILES:
        shutil.copy2(os.path.join(LESSON, name), folder)
    shutil.copytree(os.path.join(LESSON, "checks"), folder / "checks",
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
    applied = subprocess.run(["git", "apply", "--verbose", KEY], cwd=folder, capture_output=True, text=True)
    assert applied.returncode == 0, f"the answer key no longer applies:\n{applied.stderr}"
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
    assert len(own) == 4 and all(" FAIL, " not in line for line in own), own


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_the_gate_compiles_with_its_bias_cases(solved):
    folder, _ = solved
    assert "with_bias" in (folder / "gate.cu").read_text()
    result = subprocess.run([NVCC, "-O0", "-gencode", "arch=compute_75,code=sm_75", "-o", str(folder / "gate"),
                             str(folder / "gate.cu")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_the_variant_tool_compiles_on_the_solved_copy(solved, tmp_path):
    folder, _ = solved
    result = compile_variants(str(folder), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]

"""pytest: DAY87_FAST_KERNEL and DAY87_FAST_BACKWARD take what ships and refuse the rest by
name, as fast/csrc's own C++ answers (nvcc; no GPU).

    cd fast && python -m pytest -q tests/test_switches.py

fast/csrc/binding.cpp raises with kernelSwitchProblem() (launch_policy.cu) and
backwardSwitchProblem() (backward_version1_scaled.cu) before any launch. Both read their
variable before they ask the device anything, but for persistent, so a small program that
includes the two files and prints both answers shows each refusal here; tests/switches.py
holds what each must say, and, run on a GPU, the same through the installed package. Each
place a refusal names must hold what it names: the study's file in the tree, a path at the
commit named.
"""

import os
import subprocess

import pytest

from proof import REPOSITORY
from proof.ptx import nvcc
from tests import switches
from tests.walker_helpers import needs_nvcc

SOURCES = os.path.join(REPOSITORY, "fast", "csrc")
PROGRAM = """#include <cstdio>

#include "launch_policy.cu"
#include "backward_version1_scaled.cu"

// What binding.cpp would raise with for each switch as the environment sets it: a line
// each, empty where the value is taken.
int main() {
    printf("%s\\n%s\\n", tuned::kernelSwitchProblem().c_str(),
           tuned::backwardSwitchProblem().c_str());
}
"""


@pytest.fixture(scope="module")
def answering(tmp_path_factory):
    """The program, compiled once: PTX alone (no ptxas) for compute_75, since only its
    host code runs."""
    folder = tmp_path_factory.mktemp("switches")
    (folder / "switches.cu").write_text(PROGRAM)
    subprocess.run([nvcc(), "-arch=compute_75", "-code=compute_75", f"-I{SOURCES}", "-o",
                    str(folder / "switches"), str(folder / "switches.cu")], check=True)
    return str(folder / "switches")


def answers(program, switch, value):
    """{switch: the launcher's answer} with `switch` set to `value` and the other unset."""
    environment = {name: text for name, text in os.environ.items() if name not in switches.TAKEN}
    ran = subprocess.run([program], env={**environment, switch: value}, capture_output=True,
                         text=True, check=True)
    return dict(zip(switches.TAKEN, ran.stdout.split("\n")[:2]))


@needs_nvcc
@pytest.mark.parametrize("switch, value", switches.CASES)
def test_each_value_is_taken_or_refused_by_name(answering, switch, value):
    said = answers(answering, switch, value)
    assert switches.problems(switch, value, said[switch]) == []
    other = next(name for name in switches.TAKEN if name != switch)
    assert said[other] == "", f"{other} unset, and still: {said[other]}"


def test_each_place_named_holds_the_version():
    """A study's file is in the tree; `git show COMMIT:PATH` names a file of that commit."""
    for parts in switches.REFUSED.values():
        for part in parts:
            if part.startswith("git show "):
                commit, path = part.removeprefix("git show ").split(":", 1)
                known = subprocess.run(["git", "-C", REPOSITORY, "cat-file", "-e", commit],
                                       capture_output=True)
                if known.returncode != 0:
                    pytest.skip(f"this clone does not hold {commit} (a shallow one?)")
                held = subprocess.run(["git", "-C", REPOSITORY, "cat-file", "-e",
                                       f"{commit}:{path}"], capture_output=True)
                assert held.returncode == 0, f"{commit} holds no {path}"
            elif part.startswith("fast/"):
                assert os.path.exists(os.path.join(REPOSITORY, part)), f"no {part}"


def test_a_wrong_answer_is_seen():
    """problems() can fail: a refusal that names no place, a value taken that should be
    refused, and one refused that should be taken."""
    assert switches.problems("DAY87_FAST_KERNEL", "hopper",
                             "DAY87_FAST_KERNEL must be persistent, wmma or auto; got 'hopper'")
    assert switches.problems("DAY87_FAST_BACKWARD", "one-launch", "")
    assert switches.problems("DAY87_FAST_KERNEL", "wmma", "DAY87_FAST_KERNEL must be ...")
    assert not switches.problems("DAY87_FAST_KERNEL", "persistent",
                                 "DAY87_FAST_KERNEL=persistent, and this device does not run "
                                 "version 3")

"""fast/README.md does what it says: its install commands are the ones CI runs in a fresh
venv, in the same order, and its Python examples run (here on the CPU reference, where no
GPU is visible) with their own check of the result.

Run from fast/ with the package installed: python -m pytest -q tests/test_readme.py
"""

import os
import re

import pytest

FAST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(FAST, "README.md")
CI = os.path.join(os.path.dirname(FAST), ".ci", "run")


def blocks(language):
    """The README's fenced blocks in `language`, in order."""
    with open(README) as file:
        return re.findall(rf"```{language}\n(.*?)```", file.read(), re.S)


def install_commands():
    """The README's install block: one command a line."""
    return [line.strip() for line in blocks("bash")[0].splitlines() if line.strip()]


def ci_fresh_venv_commands(text):
    """What .ci/run's fresh-venv step runs with pip: `in_fresh_venv pip ...` lines, in order."""
    return [line.split("in_fresh_venv ", 1)[1].strip() for line in text.splitlines()
            if line.startswith("in_fresh_venv pip install")]


def test_ci_runs_the_readmes_install_commands():
    with open(CI) as file:
        ci = ci_fresh_venv_commands(file.read())
    assert install_commands() == ci, (install_commands(), ci)


def test_a_changed_ci_step_is_seen():
    # The parser itself: a CI step whose commands are swapped, or that drops the flag,
    # must read as other commands than the README's.
    with open(CI) as file:
        text = file.read()
    swapped = text.replace("in_fresh_venv pip install torch", "in_fresh_venv pip install TORCH")
    swapped = swapped.replace("in_fresh_venv pip install --no-build-isolation ./fast",
                              "in_fresh_venv pip install torch ninja \"setuptools>=70.1\"")
    swapped = swapped.replace("in_fresh_venv pip install TORCH",
                              "in_fresh_venv pip install --no-build-isolation ./fast")
    isolated = text.replace("in_fresh_venv pip install --no-build-isolation ./fast",
                            "in_fresh_venv pip install ./fast")
    for changed in (swapped, isolated):
        assert changed != text
        assert ci_fresh_venv_commands(changed) != install_commands()


def test_the_examples_run():
    pytest.importorskip("day87_fast", reason="the package is not installed")
    namespace = {}
    for source in blocks("python"):
        exec(compile(source, README, "exec"), namespace)  # each asserts its own result
    assert namespace["c"].shape == (256, 512)
    assert namespace["out"].shape == (256, 384)


def test_a_wrong_example_fails():
    # The first example's own check must catch a wrong result: the bias left out.
    pytest.importorskip("day87_fast", reason="the package is not installed")
    wrong = blocks("python")[0].replace("wmma_mm_bias(a, b, bias)", "wmma_mm(a, b)")
    assert wrong != blocks("python")[0]
    with pytest.raises(AssertionError):
        exec(compile(wrong, README, "exec"), {})

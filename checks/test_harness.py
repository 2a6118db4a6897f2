"""test_harness.py: test_op.py as a module (no GPU needed).

    python -m pytest checks/test_harness.py

Nine files import test_op.py for its rows and helpers, so importing it must change
nothing in their process: no environment variable, no torch setting. The compile
rows switch torch.compile's autograd cache off for themselves, and back.
Each test runs in a fresh process, as a student's does.
"""
import subprocess
import sys

from test_build import LESSON, environment

IMPORT_CHANGES_NOTHING = """
import os, torch, torch._functorch.config as config
before, cache = dict(os.environ), config.enable_autograd_cache
import test_op
after = dict(os.environ)
print("environment:", sorted(name for name in before.keys() | after.keys()
                             if before.get(name) != after.get(name)))
print("autograd cache:", cache, config.enable_autograd_cache)
seen = []  # the setting while check_compile's questions run
questions = test_op.compile_questions
test_op.compile_questions = lambda *arguments: seen.append(config.enable_autograd_cache)
test_op.check_compile(test_op.LESSON, "cpu")
test_op.compile_questions = questions
print("in the compile row:", seen, "after it:", config.enable_autograd_cache)
"""


def run(code, cache, timeout=900):
    return subprocess.run([sys.executable, "-c", code], cwd=LESSON, env=environment(cache),
                          capture_output=True, text=True, timeout=timeout)


def test_importing_the_harness_changes_nothing(tmp_path):
    """Importing test_op changes no environment variable and leaves torch's autograd
    cache as it was; the compile row switches the cache off while it runs, and back."""
    result = run(IMPORT_CHANGES_NOTHING, tmp_path / "cache")
    said = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert said.get("environment") == "[]", \
        f"importing test_op changed the environment variables {said.get('environment')}"
    assert said.get("autograd cache") == "True True", \
        f"torch's autograd cache before and after importing test_op: {said.get('autograd cache')}"
    assert result.returncode == 0, result.stderr[-1500:]
    assert said.get("in the compile row") == "[False] after it: True", result.stdout[-600:]

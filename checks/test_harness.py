"""test_harness.py: test_op.py as a module, and row 14's verdicts (no GPU needed).

    python -m pytest checks/test_harness.py

Nine files import test_op.py for its rows and helpers, so importing it must change
nothing in their process: no environment variable, no torch setting. The compile
rows switch torch.compile's autograd cache off for themselves, and back.

Row 14 builds gate.cu and runs it where a GPU is visible. A machine without one
never runs it, so here the row is handed stand-in gates (plain C++, built by the
row itself with nvcc) that pass, fail, fault, die and hang, with a GPU pretended:
the row must pass only where the gate printed its PASS line and exited 0, and must
name what a failing gate printed. The built gate is kept, keyed on the text of gate.cu
and of what it includes: an edit of an included file builds it again. Each test runs
in a fresh process, as a student's does.
"""
import json
import subprocess
import sys

import pytest

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


# Stand-ins for gate.cu: what a gate can do, in a few lines of host code each.
STAND_INS = {
    "passes": 'puts("gate: NVIDIA stand-in, sm_75"); puts("gate: PASS"); return 0;',
    "fails a shape": 'puts("  256 x   512 x   384     0.50% of bound   pass");'
                     'puts("  512 x  1024 x   128   812.00% of bound   FAIL");'
                     'puts("gate: FAIL"); return 1;',
    "faults": 'fprintf(stderr, "CUDA error an illegal memory access was encountered at '
              'gate.cu:80\\n"); return 1;',
    "dies": 'puts("gate: NVIDIA stand-in, sm_75"); fflush(stdout); raise(SIGSEGV); return 0;',
    "hangs": 'puts("gate: NVIDIA stand-in, sm_75"); fflush(stdout); for (;;) sleep(1);',
    "says PASS, exits 1": 'puts("gate: PASS"); return 1;',
    "exits 0, no PASS": 'puts("gate: NVIDIA stand-in, sm_75"); return 0;',
}

# What the row must say of each: pass, or FAIL with these words.
VERDICTS = {
    "passes": ("pass", ["built for sm_75 and linked", "gate: PASS"]),
    "fails a shape": ("FAIL", ["512 x  1024 x   128   812.00% of bound   FAIL",
                               "Doing the exercise?"]),
    "faults": ("FAIL", ["CUDA error an illegal memory access was encountered at gate.cu:80"]),
    "dies": ("FAIL", ["killed by SIGSEGV"]),
    "hangs": ("FAIL", ["did not finish in 3 s", "'gate: NVIDIA stand-in, sm_75'"]),
    "says PASS, exits 1": ("FAIL", ["exit 1, its last line 'gate: PASS'"]),
    "exits 0, no PASS": ("FAIL", ["exit 0, its last line 'gate: NVIDIA stand-in, sm_75'"]),
}

# Row 14 on each stand-in, with a GPU pretended (the stand-ins touch none) and a short
# time limit for the one that hangs: one line "name|verdict|what the row said" each.
ROW_ON_STAND_INS = """
import json, os, sys, torch, test_op
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda device=None: (7, 5)
test_op.GATE_TIME_LIMIT = 3
for name, folder in json.loads(sys.argv[1]).items():
    try:
        verdict, said = "pass", test_op.check_gate(test_op.LESSON.with_gate(folder + "/gate.cu"))
    except (test_op.Fail, test_op.Skip) as outcome:
        verdict, said = type(outcome).__name__.replace("Fail", "FAIL"), str(outcome)
    print(name, verdict, said.replace("\\n", " "), sep="|")
"""


def test_row_14_verdicts_on_stand_in_gates(tmp_path):
    """The row passes only where the gate printed its PASS line and exited 0, and names
    the first failing line, the fault, the signal, or the time limit otherwise."""
    folders = {}
    for index, (name, body) in enumerate(STAND_INS.items()):
        folder = tmp_path / f"stand-in-{index}"
        folder.mkdir()
        (folder / "gate.cu").write_text(
            "#include <csignal>\n#include <cstdio>\n#include <unistd.h>\n"
            f"int main() {{ {body} }}\n")
        folders[name] = str(folder)
    result = subprocess.run([sys.executable, "-c", ROW_ON_STAND_INS, json.dumps(folders)],
                            cwd=LESSON, env=environment(tmp_path / "cache"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-1500:]
    rows = dict(line.split("|", 1) for line in result.stdout.splitlines() if "|" in line)
    if "Skip|no nvcc" in rows.get("passes", ""):
        pytest.skip("no nvcc: row 14 skips, and builds no gate")
    for name, (verdict, words) in VERDICTS.items():
        got, said = rows[name].split("|", 1)
        assert got == verdict, f"{name}: {got}, expected {verdict}: {said}"
        missing = [word for word in words if word not in said]
        assert not missing, f"{name}: the row does not say {missing}: {said}"


# Row 14 on one gate, pretended GPU, run twice with an edit between: "verdict|what it said".
ROW_TWICE = """
import sys, torch, test_op
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda device=None: (7, 5)
gate, header, edited = sys.argv[1:]
for run in range(2):
    try:
        print("pass", test_op.check_gate(test_op.LESSON.with_gate(gate)), sep="|")
    except test_op.Fail as failure:
        print("FAIL", str(failure).splitlines()[0], sep="|")
    with open(header, "w") as text:
        text.write(edited)
"""


def test_row_14_rebuilds_when_an_included_file_changes(tmp_path):
    """The gate is built once and kept, keyed on the text of gate.cu and of every file it
    includes, wherever that file is: here a header in another folder, edited between two
    runs of the row. A gate kept from before the edit would pass the second run too."""
    (tmp_path / "gate").mkdir()
    (tmp_path / "shared").mkdir()
    header = tmp_path / "shared" / "verdict.h"
    header.write_text('#define VERDICT "gate: PASS"\n#define STATUS 0\n')
    (tmp_path / "gate" / "gate.cu").write_text(
        '#include <cstdio>\n#include "../shared/verdict.h"\n'
        "int main() { puts(VERDICT); return STATUS; }\n")
    edited = '#define VERDICT "gate: FAIL"\n#define STATUS 1\n'
    result = subprocess.run([sys.executable, "-c", ROW_TWICE, str(tmp_path / "gate" / "gate.cu"),
                             str(header), edited], cwd=LESSON, env=environment(tmp_path / "cache"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-1500:]
    verdicts = [line.split("|")[0] for line in result.stdout.splitlines() if "|" in line]
    assert verdicts == ["pass", "FAIL"], f"before and after the edit: {result.stdout[-600:]}"

"""solved.py: a copy of the lesson with the exercise solved, for the tools that grade one.

    python checks/solved.py FOLDER          # copy the lesson into FOLDER, solved
    python checks/solved.py --key FOLDER    # the same, from the answer key's own text

A folder whose binding.cpp already defines wmma_mm_bias is solved: its copy is the
folder as it is, so that the tools grade the student's own solution. Only an unsolved
copy gets checks/answer_key.patch. `--key` (the mistakes tool, which edits the key's
lines) refuses a folder solved some other way, where those lines are not there.
"""

import os
import re
import shutil
import subprocess
import sys

LESSON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = os.path.join(LESSON, "checks", "answer_key.patch")
SEVEN_FILES = ("kernel.cu", "binding.cpp", "op.py", "test_op.py", "gate.cu", "README.md",
               "requirements.txt")


def is_solved(folder=LESSON):
    """True where binding.cpp defines the exercise's schema."""
    with open(os.path.join(folder, "binding.cpp")) as source:
        return re.search(r'm\.def\(\s*"wmma_mm_bias\(', source.read()) is not None


def holds_the_key(folder=LESSON):
    """True where the folder's solution is the answer key's: the key reverses on it."""
    return subprocess.run(["git", "apply", "--check", "--reverse", KEY], cwd=folder,
                          capture_output=True).returncode == 0


def solved_copy(destination, from_key=False):
    """Copy the seven files and checks/ into `destination` (made if missing) and solve
    the copy where the lesson is unsolved; returns how it was solved, in words."""
    os.makedirs(destination, exist_ok=True)
    for name in SEVEN_FILES:
        shutil.copy2(os.path.join(LESSON, name), destination)
    shutil.copytree(os.path.join(LESSON, "checks"), os.path.join(destination, "checks"),
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("results", "__pycache__"))
    if is_solved():
        if from_key and not holds_the_key():
            raise SystemExit("solved.py: this folder's wmma_mm_bias is not the answer key's, "
                             "and the mistakes are edits of the key's lines: "
                             "run it on an unsolved copy")
        return "the folder's own wmma_mm_bias"
    applied = subprocess.run(["git", "apply", KEY], cwd=destination, capture_output=True, text=True)
    if applied.returncode:
        raise SystemExit(f"solved.py: the answer key no longer applies to the lesson:\n"
                         f"{applied.stderr}")
    return "the answer key, applied"


if __name__ == "__main__":
    arguments = sys.argv[1:]
    from_key = arguments[:1] == ["--key"]
    if len(arguments) != 1 + from_key:
        sys.exit(__doc__)
    print(f"solved.py: {arguments[-1]}: {solved_copy(arguments[-1], from_key)}")

"""pytest: every path, module and flag that the scripts name exists (no GPU needed).

    cd fast && python -m pytest -q tests/test_named_paths.py

A part of fast/proof/gpu_check.sh runs only on a GPU, and the lesson's
checks/gpu_check.sh, .ci/run and proof/planted_bugs.py name files by their paths:
a file moved or a flag renamed would show only when that part next runs. Here every
such name is looked up: a source path (.py, .cu, .cuh, .cpp, .sh, .patch) under the
lesson's folder or fast/, a `python -m` module, and each `--flag` given to one of
this project's programs, in that program's source. bash -n reads each script.
"""

import pathlib
import re
import subprocess

import pytest

from proof import planted_bugs
from tests.lesson_folder import LESSON

LESSON_FOLDER = pathlib.Path(LESSON)
FAST_FOLDER = LESSON_FOLDER / "fast"
SCRIPTS = [".ci/run", "checks/gpu_check.sh", "checks/gpu_check_steps.sh",
           "fast/proof/gpu_check.sh"]
# The folders a script's relative paths start from: it works in the lesson's folder or
# in fast/.
ROOTS = (LESSON_FOLDER, FAST_FOLDER)
PATH = re.compile(r"(?<![\w$/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|cu|cuh|cpp|sh|patch))\b")
MODULE = re.compile(r"python3? -m ([\w.]+)((?:[ \t]+[^\s|;&)]+)*)")
# A program of this project run with flags, built under OUT (in a plain, an ordering or a
# compute_75 build): the gate, or a study, named as its source in fast/studies/ is.
PROGRAM_RUN = re.compile(r'"\$out/(\w+?)(?:_ordering|75)?"((?:\s+--[\w-]+)+)')
NOT_OURS = {"pytest", "pip", "venv"}


def script_text(name):
    # Comments name paths too, and those must hold as well.
    return (LESSON_FOLDER / name).read_text()


def exists(relative):
    """A path with a folder, from the lesson's folder or fast/; a bare file name (in
    a comment, say "bench.py") anywhere in the tree."""
    if "/" not in relative:
        return any(LESSON_FOLDER.rglob(relative))
    return any((root / relative).exists() for root in ROOTS)


def module_source(module):
    relative = pathlib.Path(*module.split("."))
    for root in ROOTS:
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.exists():
                return candidate.read_text()
    return None


def program_source(program):
    """The text of a program's source: the gate's files (proof/gate*.cu*) or a study's."""
    study = FAST_FOLDER / "studies" / f"{program}.cu"
    paths = [study] if study.exists() else sorted((FAST_FOLDER / "proof").glob(f"{program}*.cu*"))
    return "".join(path.read_text() for path in paths)


def named_paths(text):
    return sorted({path for path in PATH.findall(text) if "$" not in path and "*" not in path})


@pytest.mark.parametrize("script", SCRIPTS)
def test_bash_reads_it(script):
    result = subprocess.run(["bash", "-n", str(LESSON_FOLDER / script)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_path_it_names_exists(script):
    missing = [path for path in named_paths(script_text(script)) if not exists(path)]
    assert not missing, f"{script} names {missing}, which exist neither in the lesson nor fast/"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_module_and_flag_it_runs_exists(script):
    problems = []
    for module, arguments in MODULE.findall(script_text(script)):
        if module.split(".")[0] in NOT_OURS:
            continue
        source = module_source(module)
        if source is None:
            problems.append(f"python -m {module}: no such module")
            continue
        problems += [f"python -m {module} {flag}: not in its source"
                     for flag in re.findall(r"--[\w-]+", arguments) if f'"{flag}"' not in source]
    for program, arguments in PROGRAM_RUN.findall(script_text(script)):
        source = program_source(program)
        problems += [f"{program} {flag}: not in its source" if source else f"{program}: no source"
                     for flag in arguments.split() if f'"{flag}"' not in source]
    assert not problems, f"{script}: " + "; ".join(problems)


def test_every_file_a_planted_bug_edits_exists():
    missing = sorted({path for bug in planted_bugs.BUGS.values() for path in bug.files
                      if not (LESSON_FOLDER / path).exists()})
    assert not missing, f"planted_bugs.py edits {missing}, which do not exist"


def test_a_wrong_name_is_seen():
    """The lookups above can fail: a moved file, a module, a program and a flag that are
    not."""
    text = ('python3 -m proof.no_such_tool\n"$out/gate_ordering" --no-such-flag\n'
            "nvcc -o gate fast/gate.cu  # gate_v2.cu\n")
    assert [path for path in named_paths(text) if not exists(path)] == ["fast/gate.cu",
                                                                        "gate_v2.cu"]
    assert module_source("proof.no_such_tool") is None
    assert PROGRAM_RUN.findall(text) == [("gate", " --no-such-flag")]
    assert '"--no-such-flag"' not in program_source("gate") and program_source("gate")
    assert '"--no-timing"' in program_source("version2_hopper")
    assert program_source("no_such_study") == ""

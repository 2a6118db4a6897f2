"""pytest: the package builds what its launcher chooses, and a study stands apart (no GPU).

    cd fast && python -m pytest -q tests/test_studies.py

A study (fast/studies/) is one .cu file with its own driver (a main), built by the gates,
the planted bugs and CI, never by setup.py. So: setup.py's CUDA sources are files of
fast/csrc/, and what they include, all the way down, is fast/csrc/'s too; no file of
fast/csrc/ names a study in an #include; and every study is built by CI (.ci/run) and by
a part of fast/proof/gpu_check.sh, and has a main.
"""

import importlib.util
import pathlib
import re

FAST = pathlib.Path(__file__).resolve().parent.parent
CSRC, STUDIES = FAST / "csrc", FAST / "studies"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def setup_sources():
    """fast/setup.py's CUDA_SOURCES and binding.cpp, as paths: its module, without running
    setup()."""
    spec = importlib.util.spec_from_file_location("day87_fast_setup", FAST / "setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return [pathlib.Path(setup.SOURCES) / name for name in [*setup.CUDA_SOURCES, "binding.cpp"]]


def included_outside(source, folder):
    """The files that `source` includes ("..." includes, followed all the way down) that
    lie outside `folder`, as text; an include that is not found is named too."""
    outside, seen, pending = [], set(), [source.resolve()]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        if not path.exists():
            outside.append(f"{path} (not found)")
            continue
        if folder.resolve() not in path.parents:
            outside.append(str(path))
            continue
        pending += [(path.parent / name).resolve() for name in INCLUDE.findall(path.read_text())]
    return outside


def test_the_package_builds_fast_csrc_alone():
    sources = setup_sources()
    assert sources and all(path.exists() for path in sources), sources
    for source in sources:
        assert included_outside(source, CSRC) == [], f"{source.name} reaches outside csrc/"


def test_no_shipped_file_includes_a_study():
    for path in sorted(CSRC.iterdir()):
        includes = INCLUDE.findall(path.read_text())
        assert not [name for name in includes if "studies" in name], f"{path.name}: {includes}"


def test_every_study_has_a_driver_and_is_built_by_ci_and_the_gpu_check():
    studies = sorted(STUDIES.glob("*.cu"))
    assert studies, "fast/studies/ holds no study"
    ci, gpu_check = (FAST.parent / ".ci" / "run").read_text(), \
        (FAST / "proof" / "gpu_check.sh").read_text()
    for study in studies:
        assert re.search(r"^int main\(", study.read_text(), re.MULTILINE), f"{study.name}: no main"
        assert f"fast/studies/{study.name}" in ci, f".ci/run does not build {study.name}"
        assert f"studies/{study.name}" in gpu_check, f"gpu_check.sh does not build {study.name}"


def test_a_reach_outside_is_seen(tmp_path):
    """included_outside can fail: a shipped file that includes a study."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "study.cu").write_text("int main() {}\n")
    shipped = tmp_path / "csrc" / "shipped.cu"
    shipped.write_text('#include "../studies/study.cu"\n')
    assert included_outside(shipped, tmp_path / "csrc") == [
        str((tmp_path / "studies" / "study.cu").resolve())]

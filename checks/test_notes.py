"""test_notes.py: both tiers' notes and every README keep the form they promise (no GPU).

    python -m pytest checks/test_notes.py

The notes are checks/NOTES.md (the lesson's) and fast/NOTES.md (the fast tier's); the
READMEs are README.md, checks/README.md, fast/README.md, each fast/*/README.md and the
package's, fast/src/day87_fast/README.md. Each row of a notes table is the current figure
of one thing, with the log it comes from; the log (its name, its header) holds the clock
time and the commit. So here, on the real
files:
- no table cell over 200 characters, in any notes or README file;
- no clock time (17:40) and no commit hash (c3cbc84) in a notes cell, a log's name aside;
- every log or SVG a file cites exists where it is cited: a bare name in the `results/`
  folder beside the file, a name with a path (`../fast/results/...`) at that path;
- no file cites a log in an `archive/` folder;
- every file in checks/results/ and fast/results/ is cited by a notes file;
- fast/README.md is under 10,000 bytes.
Each test also runs its check on a deliberately broken copy and sees it fail there.
"""
import re
from pathlib import Path

import pytest

LESSON = Path(__file__).resolve().parent.parent
# The two tiers' notes cite each other's logs: in a copy of the lesson without fast/ (the
# next lesson's folder), there is nothing here to hold to this form.
pytestmark = pytest.mark.skipif(not (LESSON / "fast").is_dir(),
                                reason="fast/ is deleted: the notes cite its logs")
NOTES = [LESSON / "checks" / "NOTES.md", LESSON / "fast" / "NOTES.md"]
READMES = [LESSON / "README.md", LESSON / "checks" / "README.md", LESSON / "fast" / "README.md",
           *sorted((LESSON / "fast").glob("*/README.md")),
           *sorted((LESSON / "fast" / "src").glob("*/README.md"))]
RESULTS = [LESSON / "checks" / "results", LESSON / "fast" / "results"]
FAST_README = LESSON / "fast" / "README.md"

MAX_CELL = 200
MAX_FAST_README_BYTES = 10_000
# <machine>-<date>[-HHMM]-<what ran>.<ext>, as results/ names its logs.
LOG_NAME = re.compile(r"\b(?:h200x2|h200|h100|here)-\d{4}-\d\d-\d\d-[\w.+-]*?\.(?:log|svg|py)\b")
# A log's name with the path written before it, if any: `../fast/results/NAME`, `results/NAME`.
CITATION = re.compile(r"((?:[\w.-]+/)*)(" + LOG_NAME.pattern[2:] + ")")
# 17:40 or 8:32; a ratio such as 1:2 is not one.
CLOCK_TIME = re.compile(r"\b(?:[01]?\d|2[0-3]):[0-5]\d\b")
# 7 to 40 lowercase hex digits, at least one a digit and one a letter, as a whole word.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def table_cells(text):
    """(line number, cell) for each cell of each table row; a | inside `code` is text."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|"):
            continue
        cells, cell, in_code = [], "", False
        for char in line.strip()[1:]:
            if char == "`":
                in_code = not in_code
            if char == "|" and not in_code:
                cells.append(cell.strip())
                cell = ""
            else:
                cell += char
        yield from ((number, cell) for cell in cells)


def long_cells(text, name="NOTES.md"):
    return [f"{name} line {number}: a cell of {len(cell)} characters: {cell[:70]}..."
            for number, cell in table_cells(text) if len(cell) > MAX_CELL]


def times_and_commits(text):
    """Clock times and commit hashes in cells, once the log names (which hold HHMM) are out."""
    problems = []
    for number, cell in table_cells(text):
        words = LOG_NAME.sub("<log>", cell)
        for kind, pattern in (("a clock time", CLOCK_TIME), ("a commit", COMMIT)):
            problems += [f"line {number}: {kind} {found!r} in the cell {cell[:70]!r}"
                         for found in pattern.findall(words)]
    return problems


def citations(text, folder):
    """The path each cited log resolves to: a bare name in folder/results, else its path."""
    for prefix, name in CITATION.findall(text):
        yield prefix, (folder / prefix / name if prefix else folder / "results" / name)


def missing_logs(text, folder, name="NOTES.md"):
    return [f"{name} cites {prefix}{path.name}, which is not at {path}"
            for prefix, path in citations(text, folder) if not path.is_file()]


def archived_citations(text, name="NOTES.md"):
    return [f"{name} cites {prefix}{Path(path).name} in an archive/ folder"
            for prefix, path in CITATION.findall(text) if "archive/" in prefix]


def uncited_logs(texts_and_folders, results):
    cited = {path.resolve() for text, folder in texts_and_folders
             for _, path in citations(text, folder)}
    return [f"{path} is cited by no notes file (a log no note cites leaves; git keeps it)"
            for path in sorted(results.iterdir()) if path.is_file() and path.resolve() not in cited]


def too_big(size):
    return ([f"fast/README.md is {size} bytes, not under {MAX_FAST_README_BYTES}"]
            if size >= MAX_FAST_README_BYTES else [])


def every_file():
    return NOTES + READMES


def assert_none(problems):
    assert not problems, "\n" + "\n".join(problems)


def a_row(cell):
    return f"| what | {cell} | H200 | 2026-12-03 | `h200-2026-12-03-0841-bench.log` |\n"


def test_the_files_are_there():
    assert_none([f"{path} is missing" for path in every_file() if not path.is_file()])
    assert len(READMES) >= 8, READMES  # the lesson's, checks/, fast/ and fast/'s five folders


def test_no_cell_over_200_characters():
    assert_none([problem for path in every_file()
                 for problem in long_cells(path.read_text(), str(path.relative_to(LESSON)))])
    for path in every_file():
        broken = long_cells(path.read_text() + a_row("x" * (MAX_CELL + 1)))
        assert len(broken) == 1 and f"a cell of {MAX_CELL + 1} characters" in broken[0], path
    assert long_cells(a_row("x" * MAX_CELL)) == []


def test_no_clock_time_or_commit_in_a_notes_cell():
    assert_none([problem for path in NOTES for problem in times_and_commits(path.read_text())])
    assert times_and_commits(a_row("ratios 1:2, 17 / 0 / 2 in `h200-2026-12-03-1740-x.log`")) == []
    broken = times_and_commits(a_row("at 17:40, then 08:32") + a_row("the files of c3cbc84"))
    assert [problem.split(" in the cell")[0] for problem in broken] == [
        "line 1: a clock time '17:40'", "line 1: a clock time '08:32'",
        "line 2: a commit 'c3cbc84'"]


def test_every_cited_log_is_where_it_is_cited():
    assert_none([problem for path in every_file()
                 for problem in missing_logs(path.read_text(), path.parent,
                                             str(path.relative_to(LESSON)))])
    checks, fast = NOTES[0].parent, NOTES[1].parent
    here = "h200-2026-12-04-0621-bench-forward.svg"  # in fast/results/
    assert missing_logs(f"`{here}`", fast) == []
    assert missing_logs(f"`../fast/results/{here}`", checks) == []
    assert missing_logs(f"![a picture](results/{here})", fast) == []
    assert missing_logs(f"`{here}`", checks) == [
        f"NOTES.md cites {here}, which is not at {checks / 'results' / here}"]
    assert len(missing_logs(f"`../checks/results/{here}`", fast)) == 1


def test_no_citation_into_an_archive_folder():
    assert_none([problem for path in every_file()
                 for problem in archived_citations(path.read_text(),
                                                   str(path.relative_to(LESSON)))])
    for results in RESULTS:
        assert not (results / "archive").exists(), f"{results / 'archive'} is back"
    archived = "results/archive/h200-2026-11-30-0344-compute75-plans-t4-occupancy.log"
    assert archived_citations(a_row(f"`{archived}`")) == [
        "NOTES.md cites results/archive/h200-2026-11-30-0344-compute75-plans-t4-occupancy.log"
        " in an archive/ folder"]
    assert missing_logs(a_row(f"`{archived}`"), NOTES[1].parent)  # and it is not there


def test_every_log_in_results_is_cited(tmp_path):
    notes = [(path.read_text(), path.parent) for path in NOTES]
    for results in RESULTS:
        assert_none(uncited_logs(notes, results))
    copy = tmp_path / "fast"
    (copy / "results").mkdir(parents=True)
    for path in RESULTS[1].iterdir():
        (copy / "results" / path.name).touch()
    (copy / "results" / "h200-2026-12-04-0900-a-run-nobody-cites.log").touch()
    assert uncited_logs([(NOTES[1].read_text(), copy), (NOTES[0].read_text(), tmp_path / "checks")],
                        copy / "results") == [
        f"{copy}/results/h200-2026-12-04-0900-a-run-nobody-cites.log is cited by no notes file"
        " (a log no note cites leaves; git keeps it)"]


def test_fast_readme_under_10000_bytes():
    assert_none(too_big(FAST_README.stat().st_size))
    assert too_big(MAX_FAST_README_BYTES) and not too_big(MAX_FAST_README_BYTES - 1)

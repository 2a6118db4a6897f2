"""test_notes.py: checks/NOTES.md holds today's figures in the form it promises (no GPU).

    python -m pytest checks/test_notes.py

Each table row of NOTES.md is the current figure of one thing, with the log it comes from;
the log (its name, its header) holds the clock time and the commit. So here, on the real
file: at most 400 lines; no table cell over 300 characters; no clock time (17:40) and no
commit hash (c3cbc84) in a cell, a log's file name aside; every log NOTES.md cites is in
checks/results/ (not in its archive/); every file directly in checks/results/ is cited.
Each test also runs its check on a deliberately broken copy and sees it fail there.
"""
import re
from pathlib import Path

CHECKS = Path(__file__).resolve().parent
NOTES = CHECKS / "NOTES.md"
RESULTS = CHECKS / "results"

MAX_LINES = 400
MAX_CELL = 300
# <machine>-<date>[-HHMM]-<what ran>.<ext>, as results/ names its logs.
LOG_NAME = re.compile(r"\b(?:h200x2|h200|here)-\d{4}-\d\d-\d\d-[\w.+-]*?\.(?:log|svg|py)\b")
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


def too_many_lines(text):
    count = len(text.splitlines())
    return [f"NOTES.md has {count} lines, more than {MAX_LINES}"] if count > MAX_LINES else []


def long_cells(text):
    return [f"line {number}: a cell of {len(cell)} characters: {cell[:70]}..."
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


def cited_logs(text):
    return set(LOG_NAME.findall(text))


def missing_logs(text, results):
    return [f"NOTES.md cites {name}, which is not in {results}"
            for name in sorted(cited_logs(text)) if not (results / name).is_file()]


def uncited_logs(text, results):
    cited = cited_logs(text)
    return [f"{results / path.name} is cited nowhere in NOTES.md (archive/ is for those)"
            for path in sorted(results.iterdir()) if path.is_file() and path.name not in cited]


def real_notes():
    return NOTES.read_text()


def assert_none(problems):
    assert not problems, "\n" + "\n".join(problems)


def a_row(cell):
    return f"| what | {cell} | H200 | 2026-12-03 | `h200-2026-12-03-0841-bench.log` |\n"


def test_at_most_400_lines():
    assert_none(too_many_lines(real_notes()))
    assert too_many_lines(real_notes() + "more\n" * MAX_LINES)


def test_no_cell_over_300_characters():
    assert_none(long_cells(real_notes()))
    broken = long_cells(real_notes() + a_row("x" * (MAX_CELL + 1)))
    assert len(broken) == 1 and f"a cell of {MAX_CELL + 1} characters" in broken[0]


def test_no_clock_time_or_commit_in_a_cell():
    assert_none(times_and_commits(real_notes()))
    assert times_and_commits(a_row("ratios 1:2, 17 / 0 / 2 in `h200-2026-12-03-1740-x.log`")) == []
    broken = times_and_commits(a_row("at 17:40, then 08:32") + a_row("the files of c3cbc84"))
    assert [problem.split(" in the cell")[0] for problem in broken] == [
        "line 1: a clock time '17:40'", "line 1: a clock time '08:32'",
        "line 2: a commit 'c3cbc84'"]


def test_every_cited_log_is_in_results():
    assert_none(missing_logs(real_notes(), RESULTS))
    archived = "results/archive/h200-2026-11-30-0331-forward-variants.log"
    assert missing_logs(real_notes() + a_row(f"`{archived}`"), RESULTS) == [
        f"NOTES.md cites {Path(archived).name}, which is not in {RESULTS}"]


def test_every_log_in_results_is_cited(tmp_path):
    assert_none(uncited_logs(real_notes(), RESULTS))
    for path in RESULTS.iterdir():
        if path.is_file():
            (tmp_path / path.name).touch()
    (tmp_path / "h200-2026-12-04-0900-a-run-nobody-cites.log").touch()
    assert uncited_logs(real_notes(), tmp_path) == [
        f"{tmp_path}/h200-2026-12-04-0900-a-run-nobody-cites.log is cited nowhere in NOTES.md"
        " (archive/ is for those)"]

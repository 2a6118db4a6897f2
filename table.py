"""table.py: the pass/skip/fail table that test_op.py and test_build.py print.

A check is a function: it returns a detail for its row when it passes, raises
Skip(reason) when it cannot run here, and raises Fail(what) when it finds a defect.
Any other exception is a failure too, reported with its type.
"""

NAME_WIDTH, COMPARES_WIDTH = 42, 52


class Skip(Exception):
    """The row cannot run here; the message says why."""


class Fail(Exception):
    """The row ran and found a defect; the message says which."""


def require(condition, message):
    if not condition:
        raise Fail(message)


def run_row(name, compares, check):
    """Run one check and print its row; returns 'pass', 'fail' or 'skip'."""
    try:
        status, detail = "pass", check()
    except Skip as reason:
        status, detail = "skip", str(reason)
    except Fail as defect:
        status, detail = "fail", str(defect)
    except Exception as error:  # a crash inside a check is a failure, with its cause
        status, detail = "fail", f"{type(error).__name__}: {error}"
    label = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[status]
    lines = detail.splitlines() or [""]
    print(f"{name:<{NAME_WIDTH}}{compares:<{COMPARES_WIDTH}}{label}, {lines[0]}", flush=True)
    for line in lines[1:]:
        print(f"    {line}", flush=True)
    return status


def run_table(rows):
    print(f"{'check':<{NAME_WIDTH}}{'what it compares':<{COMPARES_WIDTH}}result")
    outcomes = [run_row(*row) for row in rows]
    counts = {s: outcomes.count(s) for s in ("pass", "fail", "skip")}
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return counts["fail"] == 0

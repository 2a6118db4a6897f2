"""pytest: every bug planted_bugs.py plants still applies to the files it names, and an
edit that no longer applies is named with its bug and its file (no GPU needed).

    cd fast && python -m pytest -q tests/test_planted_bugs.py
"""
import os

import pytest

from proof import REPOSITORY, planted_bugs


@pytest.mark.parametrize("name", [name for name, bug in planted_bugs.BUGS.items() if bug.edits])
def test_every_edit_applies(name):
    bug = planted_bugs.BUGS[name]
    for file_name in bug.files:
        with open(os.path.join(REPOSITORY, file_name)) as file:
            text = file.read()
        for old, new in bug.edits:
            assert old in text, f"'{name}': {file_name} no longer has {old.strip()[:60]!r}"
            assert old != new


def test_a_stale_edit_names_its_bug_and_its_file(tmp_path):
    stale = planted_bugs.Bug(planted_bugs.VERSION3, [("    text the file does not hold\n", "")], ())
    message = (r"fast/csrc/version3_persistent\.cuh no longer has the text that "
               r"'a stale bug' edits")
    with pytest.raises(SystemExit, match=message):
        planted_bugs.copy_with_bug(str(tmp_path / "copy"), "a stale bug", stale)

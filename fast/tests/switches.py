"""switches.py: what DAY87_FAST_KERNEL and DAY87_FAST_BACKWARD take, and what they refuse.

The package holds the versions its launcher chooses: versions 1 and 3 of the forward and the
scaled backward. A value that once forced another version is refused, with a message that
says where that version is now: a study's file (fast/studies/), or the commit and path that
hold its source (fast/NOTES.md, "The versions"). tests/test_switches.py checks the
launcher's own answers, compiled from fast/csrc with no GPU; on a GPU,

    cd fast && python -m tests.switches

sets each value and calls the installed package, which must raise where the launcher
refuses and run where it takes the value. The exit status is the number of wrong answers.
"""

import os
import sys

# (switch, value): what the refusal of it must say, every part.
REFUSED = {
    ("DAY87_FAST_KERNEL", "hopper"): ["fast/studies/version2_hopper.cu"],
    ("DAY87_FAST_KERNEL", "cluster"): ["git show 4771a90:fast/csrc/version4_cluster.cuh"],
    ("DAY87_FAST_KERNEL", "split"): ["git show 4771a90:fast/csrc/version5_split_cluster.cuh"],
    ("DAY87_FAST_KERNEL", "cublas"): ["must be persistent, wmma or auto", "got 'cublas'"],
    ("DAY87_FAST_BACKWARD", "one-launch"):
        ["git show 4771a90:fast/csrc/backward_version2_one_launch.cu"],
    ("DAY87_FAST_BACKWARD", "cublas"): ["must be scaled or auto", "got 'cublas'"],
}
# What each switch takes: what ships ("" is the variable set but empty, as unset).
TAKEN = {"DAY87_FAST_KERNEL": ["", "auto", "wmma", "persistent"],
         "DAY87_FAST_BACKWARD": ["", "auto", "scaled"]}
# A value taken may still be refused on a device that cannot run it (persistent, where the
# device runs no sm_90a code): then the message says so, and names no other version.
NOT_THIS_DEVICE = "this device does not run"
CASES = [*REFUSED, *((switch, value) for switch, values in TAKEN.items() for value in values)]


def problems(switch, value, message):
    """What is wrong with `message`, the answer to `switch`=`value` ("" where the value is
    taken): each problem as text; none where the answer is right."""
    expected = REFUSED.get((switch, value))
    if expected is None:
        return ([] if not message or NOT_THIS_DEVICE in message
                else [f"{switch}={value!r} was refused: {message}"])
    if not message:
        return [f"{switch}={value!r} was taken, not refused"]
    return [f"{switch}={value!r}: the refusal does not say {part!r}: {message}"
            for part in expected if part not in message]


def answer_through_the_package(switch, value):
    """The installed package's answer to `switch`=`value`, the other switch unset: the
    message of the RuntimeError that the forward (DAY87_FAST_KERNEL) or the backward
    (DAY87_FAST_BACKWARD) raised, or "" where it ran."""
    import torch
    import day87_fast
    a = torch.randn(128, 16, dtype=torch.half, device="cuda")
    b = torch.randn(16, 128, dtype=torch.half, device="cuda")
    for variable in TAKEN:
        os.environ.pop(variable, None)
    os.environ[switch] = value
    try:
        if switch == "DAY87_FAST_KERNEL":
            day87_fast.wmma_mm(a, b)
        else:
            torch.ops.day87_fast.wmma_mm_backward(torch.randn(128, 128, device="cuda"), a, b)
        torch.cuda.synchronize()
        return ""
    except RuntimeError as error:
        return str(error)
    finally:
        os.environ.pop(switch, None)


def main():
    import torch
    if not torch.cuda.is_available():
        sys.exit("switches.py calls the package on a GPU; here there is none. "
                 "tests/test_switches.py checks the launcher's answers without one.")
    wrong = 0
    for switch, value in CASES:
        message = answer_through_the_package(switch, value)
        found = problems(switch, value, message)
        wrong += bool(found)
        print(f"{switch}={value!r}: " + ("; ".join(found) if found else
                                         f"refused: {message}" if message else "taken, ran"))
    print(f"switches: {wrong} wrong answer(s)")
    sys.exit(wrong)


if __name__ == "__main__":
    main()

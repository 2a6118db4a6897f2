"""registration_bands.py: the lesson's diagram, run on this torch.

    python checks/registration_bands.py                    # the grid; exit 1 if it departs
    python checks/registration_bands.py --svg bands.svg    # the diagram, drawn from this run
    python checks/registration_bands.py --plant more       # band 2 given a backward too,
    python checks/registration_bands.py --plant less       # or band 3 no fake: a row
                                                           # must turn (exit 1)

The lesson draws what each registration buys as three bands, each the same call
c = wmma_mm(a, b) with three outcomes: the eager call, .backward(), torch.compile.
Here each band registers the real kernels (binding.cpp's CUDA and float64 CPU
implementations, reached below the dispatcher's autograd layer, as a C++ kernel is)
under a namespace of its own, the way that band registers them:

    band 0  no operator: the lesson's opening wrapper, a plain function that
            launches on the default stream (binding.cpp's contract still applies);
            on CUDA only: the float64 path has no raw launch to wrap
    band 1  TORCH_LIBRARY + the CPU and CUDA implementations
    band 2  band 1 + register_fake
    band 3  band 2 + register_autograd            (what op.py registers)

Each band and device runs in a fresh process (a namespace cannot be unregistered)
and asks: eager against float64; backward, where the gradients must arrive and be
right; torch.compile(fullgraph=True), which must give one graph with no break and
the eager result; and on CUDA the lesson's stream case, inputs written late on a
side stream. A backward whose gradients are right only because autograd's
fallback recorded the kernel's own ATen ops (it warns that this is deprecated) is
its own verdict, "fallback". The grid prints each verdict with the first line of
what torch said, then where this torch departs from the lesson. A departure named
in KNOWN_DEPARTURES, with the verdict it names, is stated; any other fails the run,
so that a torch release that changes one of these behaviours is noticed.
"""

import json
import os
import subprocess
import sys
import warnings
from contextlib import nullcontext

# ---------------------------------------------------------------------------
# The bands, side by side: what each registers
# ---------------------------------------------------------------------------
BANDS = {
    0: "no operator: a plain wrapper, default stream",
    1: "TORCH_LIBRARY + CPU and CUDA implementations",
    2: "band 1 + register_fake",
    3: "band 2 + register_autograd",
}
CALLS = ("eager", "backward", "compile", "stream")

# What the lesson's diagram says each band gives (the stream case is the lesson's
# opening claim, for band 0; the registered bands launch on the caller's stream).
DIAGRAM = {
    0: {"eager": "pass", "backward": "fail", "compile": "fail", "stream": "fail"},
    1: {"eager": "pass", "backward": "fail", "compile": "fail", "stream": "pass"},
    2: {"eager": "pass", "backward": "fail", "compile": "pass", "stream": "pass"},
    3: {"eager": "pass", "backward": "pass", "compile": "pass", "stream": "pass"},
}

# (band, device, call): (the verdict seen, why this torch differs from the diagram
# there). Stated, not failed; the same cell with another verdict fails.
FALLBACK = ("the gradients arrive on the CPU: autograd's fallback records the float64 kernel's "
            "own at::mm and only warns that this is deprecated; on CUDA, where the kernel is a "
            "launch, they stay None")
KNOWN_DEPARTURES = {
    (1, "cpu", "backward"): ("fallback", FALLBACK),
    (2, "cpu", "backward"): ("fallback", FALLBACK),
}


def register_band(band, plant=None):
    """The band's operator (a callable), registered in a namespace of its own;
    plant "more" gives band 2 a backward too, "less" takes band 3's fake away."""
    import torch

    import op

    below_autograd = {device: torch._C.DispatchKeySet(key) for device, key in
                      (("cpu", torch._C.DispatchKey.CPU), ("cuda", torch._C.DispatchKey.CUDA))}

    def kernel(a, b):  # the real implementation for the inputs' device, invisible to autograd
        return torch.ops.day87.wmma_mm.default.redispatch(below_autograd[a.device.type], a, b)

    if band == 0:
        def opening_wrapper(a, b):  # the lesson's first listing: no operator, the default stream
            with (torch.cuda.stream(torch.cuda.default_stream(a.device)) if a.is_cuda
                  else nullcontext()):
                return kernel(a, b)
        return opening_wrapper, None
    name = f"day87_band{band}"
    library = torch.library.Library(name, "DEF")
    library.define("wmma_mm(Tensor a, Tensor b) -> Tensor")
    library.impl("wmma_mm", kernel, "CPU")
    library.impl("wmma_mm", kernel, "CUDA")
    if band >= 2 and not (plant == "less" and band == 3):
        torch.library.register_fake(f"{name}::wmma_mm", op._fake, lib=library)
    if band >= 3 or (plant == "more" and band == 2):
        torch.library.register_autograd(f"{name}::wmma_mm", op._backward,
                                        setup_context=op._setup_context, lib=library)
    return getattr(torch.ops, name).wmma_mm, library  # the library must outlive the calls


# ---------------------------------------------------------------------------
# The calls, in a child process: one band, one device
# ---------------------------------------------------------------------------
def first_line(text):
    return (str(text).strip().splitlines() or [""])[0][:160]


def ask(question):
    """('pass' or 'fail', what torch said) for one call."""
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        try:
            verdict, said = question()
        except Exception as error:
            verdict, said = "fail", f"raised {type(error).__name__}: {first_line(error)}"
    notes = [first_line(w.message) for w in heard
             if "autograd kernel was not registered" in str(w.message)]
    if notes and verdict == "pass":
        verdict = "fallback"
    return verdict, said + (f"; warned: {notes[0]}" if notes else "")


def cell(band, device, plant):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import test_op

    mm, library = register_band(band, plant)  # noqa: F841, kept alive
    dtype, shape, tolerance = ((torch.half, (256, 128, 512), 1e-2) if device == "cuda"
                               else (torch.float64, (4, 3, 5), 1e-10))
    m, k, n = shape

    def fresh(*size):
        return test_op.fresh(*size, dtype=dtype, device=device)

    def eager():
        a, b = fresh(m, k), fresh(k, n)
        ratio = test_op.error_ratio(mm(a, b), a, b)
        return ("pass" if ratio <= 1 else "fail"), f"{100 * ratio:.1f}% of the float64 bound"

    def backward():
        a, b = (fresh(m, k).requires_grad_(), fresh(k, n).requires_grad_())
        weight = torch.randn(m, n, dtype=torch.float64).to(device=device)
        c = mm(a, b)
        (c * weight.to(c.dtype)).sum().backward()
        if a.grad is None or b.grad is None:
            return "fail", (f"ran, and the gradients stay None "
                            f"(grad_fn: {type(c.grad_fn).__name__ if c.grad_fn else None})")
        wide = [t.detach().double().cpu().requires_grad_() for t in (a, b)]
        ((wide[0] @ wide[1]) * weight.cpu()).sum().backward()
        error = max(((g.double().cpu() - w.grad).norm() / w.grad.norm()).item()
                    for g, w in zip((a.grad, b.grad), wide))
        return ("pass" if error <= tolerance else "fail"), f"gradients off by {error:.1e} in norm"

    def compiled():
        from torch._dynamo.testing import CompileCounterWithBackend
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounterWithBackend("aot_eager")
        a, b = fresh(m, k), fresh(k, n)
        got = torch.compile(mm, backend=counter, fullgraph=True)(a, b)
        breaks = sum(counters["graph_break"].values())
        same = torch.equal(got, mm(a, b))
        verdict = "pass" if counter.frame_count == 1 and breaks == 0 and same else "fail"
        return verdict, (f"{counter.frame_count} graph, {breaks} breaks, "
                         f"{'equal to' if same else 'differs from'} eager")

    def stream():
        try:
            test_op.check_stream_order(test_op.LESSON.with_wrapper(mm))
        except test_op.Fail as failure:
            return "fail", first_line(failure)
        return "pass", "ordered after the side stream's writes"

    questions = {"eager": eager, "backward": backward, "compile": compiled}
    if device == "cuda":
        questions["stream"] = stream
    print(json.dumps({call: ask(question) for call, question in questions.items()}))


# ---------------------------------------------------------------------------
# The grid and the picture
# ---------------------------------------------------------------------------
def devices_of(band, devices):
    return [device for device in devices if band or device == "cuda"]


def run_grid(devices, plant):
    grid = {}
    for band in BANDS:
        for device in devices_of(band, devices):
            child = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--cell", str(band), device]
                + (["--plant", plant] if plant else []),
                capture_output=True, text=True, timeout=900)
            lines = child.stdout.strip().splitlines()
            try:
                grid[band, device] = json.loads(lines[-1])
            except (IndexError, ValueError):
                grid[band, device] = {call: ("fail", f"the child process failed: "
                                             f"{first_line(child.stderr[-400:])}")
                                      for call in CALLS if call != "stream" or device == "cuda"}
    return grid


def print_grid(grid, devices):
    print(f"{'band':<48}{'device':<8}{'call':<10}{'verdict':<9}what torch said")
    departures, unexplained = [], []
    for band, what in BANDS.items():
        for device in devices_of(band, devices):
            for call, (verdict, said) in grid[band, device].items():
                lesson = DIAGRAM[band][call]
                mark = "" if verdict == lesson else " *"
                print(f"{f'{band} {what}':<48}{device:<8}{call:<10}{verdict + mark:<9}{said}")
                if verdict != lesson:
                    known_verdict, reason = KNOWN_DEPARTURES.get((band, device, call), (None, None))
                    known = verdict == known_verdict
                    (departures if known else unexplained).append(
                        f"band {band}, {device}, {call}: {verdict}, the lesson says {lesson}"
                        + (f": {reason}" if known else ""))
    print("\n* where this torch departs from the lesson's diagram:")
    for line in departures + unexplained or ["none"]:
        print(f"  {line}")
    for line in unexplained:
        print(f"NOT IN THE LESSON AND NOT EXPLAINED: {line}")
    return not unexplained


def svg(grid, devices, title):
    """The lesson's three bands (and band 0) as boxes marked pass or fail, per device."""
    width, row_height, box, left = 1040, 96, 200, 390
    colors = {"pass": "#2e7d32", "fail": "#c62828", "fallback": "#ef6c00"}
    shown = [(band, what) for band, what in BANDS.items() if devices_of(band, devices)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{60 + row_height * len(shown)}" '
             'font-family="sans-serif" font-size="13">',
             f'<text x="12" y="24" font-size="15" font-weight="bold">{_escape(title)}</text>']
    for row, (band, what) in enumerate(shown):
        y = 44 + row * row_height
        parts.append(f'<rect x="6" y="{y}" width="{width - 12}" height="{row_height - 10}" '
                     'fill="#f5f5f5" stroke="#bbb"/>')
        parts.append(f'<text x="16" y="{y + 30}" font-weight="bold">'
                     f'band {band}: c = wmma_mm(a, b)</text>')
        parts.append(f'<text x="16" y="{y + 52}">{_escape(what)}</text>')
        for column, call in enumerate(("eager", "backward", "compile")):
            x = left + column * (box + 12)
            label = {"eager": "eager call", "backward": ".backward()",
                     "compile": "torch.compile"}[call]
            parts.append(f'<text x="{x}" y="{y + 18}" font-weight="bold">{label}</text>')
            for line, device in enumerate(devices_of(band, devices)):
                verdict = grid[band, device][call][0]
                top = y + 26 + line * 28
                parts.append(f'<rect x="{x}" y="{top}" width="{box}" height="24" rx="4" '
                             f'fill="{colors[verdict]}"/>')
                parts.append(f'<text x="{x + 8}" y="{top + 17}" fill="white">{device}: {verdict}'
                             f'''{"" if verdict == DIAGRAM[band][call]
                                  else " (lesson: " + DIAGRAM[band][call] + ")"}'''
                             '</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    arguments = sys.argv[1:]
    plant = arguments[arguments.index("--plant") + 1] if "--plant" in arguments else None
    if arguments[:1] == ["--cell"]:
        return cell(int(arguments[1]), arguments[2], plant)
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}; devices: {', '.join(devices)}"
          + {None: "", "more": "; planted: band 2 has a backward too",
             "less": "; planted: band 3 has no fake"}[plant] + "\n")
    grid = run_grid(devices, plant)
    matches = print_grid(grid, devices)
    if "--svg" in arguments:
        path = arguments[arguments.index("--svg") + 1]
        with open(path, "w") as picture:
            picture.write(svg(grid, devices,
                              f"What each registration buys: torch {torch.__version__}, "
                              f"{', '.join(devices)}"))
        print(f"\nthe diagram: {path}")
    sys.exit(0 if matches else 1)


if __name__ == "__main__":
    main()

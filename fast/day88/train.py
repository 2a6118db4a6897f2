"""train.py: day 88, run as the next lesson would: a small transformer trained on this
project's text through nn.Linear, the lesson's operator and day87_fast.Linear, each
profiled down to the kernel.

From fast/, with day87_fast installed (../fast/README.md, Install):
    python -m day88.train --profile --out OUT    # a GPU: six variants, the tables, OUT's log
                                                 # and picture
    python -m day88.train --variants torch,fast --steps 100 --profile   # a shorter GPU run
    python -m day88.train --device cpu --profile # the tiny configuration in float64 (CI)

The model (model.py): 4 blocks of width 384, sequence 256, on the GPU; 2 blocks of width
32, sequence 32, in float64 on the CPU. Its linear layers are the variant's; its head and
embeddings are torch's. Every variant starts from the same weights, sees the same batches
and trains with the same AdamW and a torch.amp.GradScaler of the same settings: FP16
gradients underflow without loss scaling. On the GPU the step runs under autocast (FP16),
as a user of nn.Linear runs it today. The variants (--variants, a comma-separated list):
- torch: nn.Linear, under autocast cuBLAS's FP16 product;
- lesson: the lesson's op.wmma_mm, with the explicit .contiguous() copy of each weight;
- fast: day87_fast.Linear;
- torch-compiled, lesson-compiled, fast-compiled: each under torch.compile(fullgraph=True),
  where it compiles whole; where it does not, the run says so and goes on without it.

For each variant, after its training steps (one line every tenth of them):
- its loss at every step, and the validation loss (the last tenth of the text, in the
  model's eager form) before and after training; the steps its GradScaler skipped;
- wall: the step's wall time, Config.timed steps back to back and one synchronize;
- host: the step's call with the GPU idle before it (synchronized first), the median of
  Config.host steps: what the host spends issuing one step, launches included;
- with --profile: torch.profiler over Config.profiled steps, the GPU time (the CPU's, on
  the CPU) of each kernel, grouped as kernel_groups.py says, and the launches per step;
  with --traces, each variant's Chrome trace in OUT/traces (never in the repository).

The checks, each stated with its tolerance (TOLERANCES), fail the run (exit status 1):
- the loss falls: the validation loss after training is at most LOSS_FALL times its value
  before;
- each variant's loss equals torch's at every step, and its validation loss after
  training, within the device's tolerance (relative).

Then the figures for the verdict: each variant's times over torch's (a compiled variant's
over torch-compiled's too), and where its GPU time differs, group by group. --out writes
the log (everything printed) and the picture (picture.py) as MACHINE-DATE-day88-train.*,
the form fast/results/ names its files.
"""

import argparse
import contextlib
import datetime
import importlib.metadata
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import NamedTuple, Optional

import torch
import torch._dynamo

from day88 import kernel_groups, model, picture
from tests.lesson_folder import LESSON

SEED = 88
VARIANTS = ("torch", "lesson", "fast", "torch-compiled", "lesson-compiled", "fast-compiled")
COMPILED = "-compiled"


class Config(NamedTuple):
    layers: int
    width: int
    heads: int
    sequence: int
    batch: int
    steps: int
    learning_rate: float
    validation_batches: int
    timed: int      # steps timed back to back for the wall time
    host: int       # steps timed one by one for the host time
    profiled: int   # steps under the profiler
    dtype: torch.dtype
    variants: tuple


CONFIGS = {
    # M = batch x sequence = 4096 rows; every K and N (384, 1152, 1536) a multiple of 128.
    # 300 steps of 4096 characters read the training text about twice; the validation
    # loss, on text the model never reads, shows whether it learnt the text by heart.
    "cuda": Config(layers=4, width=384, heads=6, sequence=256, batch=16, steps=300,
                   learning_rate=1e-3, validation_batches=8, timed=20, host=10, profiled=3,
                   dtype=torch.float32, variants=VARIANTS),
    # Seconds on a CPU: CI's. No compiled variant: on the CPU, Inductor builds C++ for each.
    "cpu": Config(layers=2, width=32, heads=2, sequence=32, batch=4, steps=30,
                  learning_rate=3e-3, validation_batches=4, timed=3, host=3, profiled=2,
                  dtype=torch.float64, variants=VARIANTS[:3]),
}


class Tolerance(NamedTuple):
    step: float        # |loss - torch's| / torch's, at every step
    validation: float  # the same, for the validation loss after training


TOLERANCES = {
    # float64 throughout: the products differ from nn.Linear's only in their order of
    # summation, about 1e-16 of each value, and thirty steps of training leave that far
    # below 1e-9; a layer that reads its weight wrongly (tests/test_day88.py's plant) moves
    # the first step's loss by 3e-3.
    "cpu": Tolerance(step=1e-9, validation=1e-9),
    # FP16: nn.Linear's products round their outputs to FP16 (2^-11), the operators keep
    # FP32; from the first update on, the variants' weights differ in their last bits and
    # the curves part a little, and a step that one variant's GradScaler skips and torch's
    # does not moves its curve a step behind. A limit set before the GPU run, not fitted to
    # it: the run prints the largest difference it saw, and the steps each scaler skipped.
    "cuda": Tolerance(step=0.05, validation=0.02),
}
LOSS_FALL = 0.9
LISTED_SHARE = 0.99  # of a variant's profiled time, listed kernel by kernel


class Result(NamedTuple):
    name: str
    not_run: Optional[str] = None    # why a variant did not run (it does not compile whole)
    losses: list = []              # the training loss at each step
    overflowed: int = 0            # training steps the GradScaler skipped: FP16 overflowed
    validation: tuple = ()         # (before, after) training
    wall: float = 0.0              # milliseconds per step
    host: float = 0.0              # milliseconds per step
    profile: Optional[kernel_groups.Profile] = None
    seconds: float = 0.0           # the variant's whole run, compiling included


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_variant(name, config, corpus, initial_state, device, profile, traces):
    """Trains, times and profiles one variant from initial_state; returns its Result."""
    started = time.perf_counter()
    kind = name.removesuffix(COMPILED)
    network = model.CharTransformer(corpus.vocabulary, config.width, config.layers,
                                    config.heads, config.sequence, model.linear_layer(kind))
    network = network.to(device, config.dtype)
    network.load_state_dict(initial_state)
    if name.endswith(COMPILED):
        torch._dynamo.reset()  # each variant compiles from nothing: its time its own
    # The step calls the compiled form; the validation loss uses the eager one (the same
    # parameters), so that no second graph is compiled for evaluation.
    forward = torch.compile(network, fullgraph=True) if name.endswith(COMPILED) else network
    # fused=True: the update in one kernel, and GradScaler hands it the scale and the
    # infinity check on the device, with no synchronization (a non-fused AdamW's step
    # reads the check back to the host).
    optimizer = torch.optim.AdamW(network.parameters(), lr=config.learning_rate, fused=True)
    scaler = torch.amp.GradScaler(device.type)
    autocast = torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda")
    batches = model.Batches(corpus.train, config.batch, config.sequence, SEED, device)
    held_out = model.validation_batches(corpus.validation, config.batch, config.sequence,
                                        config.validation_batches, device)

    def step():
        inputs, targets = batches.next()
        with autocast:
            loss = forward(inputs, targets)
        scaler.scale(loss).backward()
        with torch.profiler.record_function(kernel_groups.OPTIMIZER_SCOPE):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()  # read back only at a logged step: no synchronization

    def validation_loss():
        with torch.no_grad(), autocast:
            return torch.stack([network(*batch) for batch in held_out]).mean().item()

    before = validation_loss()
    losses = []
    for index in range(config.steps):
        try:
            losses.append(step())
        except torch._dynamo.exc.TorchDynamoException as error:  # a graph break, or a
            # failure in Inductor: compiling whole is what this variant is
            if index > 0 or not name.endswith(COMPILED):
                raise
            reason = str(error).strip().splitlines()[0]
            print(f"{name:16} does not compile whole: {type(error).__name__}: {reason}")
            return Result(name, not_run=f"does not compile whole ({type(error).__name__})")
        if index == 0 or (index + 1) % max(config.steps // 10, 1) == 0:
            print(f"{name:16} step {index + 1:4}/{config.steps}  loss {losses[-1].item():.4f}"
                  f"  {time.perf_counter() - started:6.1f} s")
    after = validation_loss()
    # The fused AdamW counts only the steps it took: a step whose gradients overflowed
    # FP16 the GradScaler skips, and lowers the scale.
    updates = optimizer.state[next(network.parameters())]["step"].item()

    synchronize(device)
    start = time.perf_counter()
    for _ in range(config.timed):
        step()
    synchronize(device)
    wall = (time.perf_counter() - start) / config.timed * 1e3

    host_times = []
    for _ in range(config.host):
        synchronize(device)
        start = time.perf_counter()
        step()
        host_times.append((time.perf_counter() - start) * 1e3)
    synchronize(device)

    grouped = None
    if profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(config.profiled):
                step()
            synchronize(device)
        grouped = kernel_groups.grouped(profiler.events(), device.type == "cuda",
                                        config.profiled)
        if traces:
            os.makedirs(traces, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(traces, f"{name}.json"))
    return Result(name, None, [loss.item() for loss in losses], config.steps - int(updates),
                  (before, after), wall, statistics.median(host_times), grouped,
                  time.perf_counter() - started)


def initial_weights(config, vocabulary):
    """nn.Linear's model, seeded: its state_dict is every variant's start (the three layer
    classes share nn.Linear's parameter names and shapes)."""
    torch.manual_seed(SEED)
    reference = model.CharTransformer(vocabulary, config.width, config.layers, config.heads,
                                      config.sequence, torch.nn.Linear)
    return reference.state_dict()


# ==== The checks ====
def relative_difference(value, reference):
    return abs(value - reference) / abs(reference)


def failed_checks(results, tolerance):
    """One line per check failed (empty: all pass): the rule, the variant, the figures."""
    ran = [result for result in results if result.not_run is None]
    reference = next((result for result in ran if result.name == "torch"), None)
    failures = []
    for result in ran:
        before, after = result.validation
        if not after <= LOSS_FALL * before:
            failures.append(f"{result.name}: rule 'the loss falls': validation loss {after:.6g}"
                            f" after training, {before:.6g} before; it must be at most "
                            f"{LOSS_FALL} times that")
        if reference is None or result is reference:
            continue
        largest, at = worst_step(result, reference)
        if largest > tolerance.step:
            failures.append(f"{result.name}: rule 'equal to torch': its loss at step {at} is "
                            f"{result.losses[at - 1]:.9g}, torch's "
                            f"{reference.losses[at - 1]:.9g}: {largest:.3g} apart "
                            f"(relative), over the tolerance {tolerance.step:g}")
        validation = relative_difference(after, reference.validation[1])
        if validation > tolerance.validation:
            failures.append(f"{result.name}: rule 'equal to torch': validation loss {after:.9g},"
                            f" torch's {reference.validation[1]:.9g}: {validation:.3g} apart "
                            f"(relative), over the tolerance {tolerance.validation:g}")
    return failures


def worst_step(result, reference):
    """(largest relative difference from the reference's loss, its step, from 1)."""
    differences = [relative_difference(loss, reference_loss)
                   for loss, reference_loss in zip(result.losses, reference.losses)]
    worst = max(range(len(differences)), key=differences.__getitem__)
    return differences[worst], worst + 1


# ==== The tables ====
def print_table(header, rows):
    """A Markdown table: the notes take it as printed."""
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def print_losses(results, tolerance):
    reference = next((result for result in results
                      if result.name == "torch" and result.not_run is None), None)
    print(f"Losses (nats per character). Tolerance against torch, relative: {tolerance.step:g}"
          f" at every step, {tolerance.validation:g} for the validation loss after training;"
          f" the loss falls: after <= {LOSS_FALL} x before.")
    rows = []
    for result in results:
        if result.not_run:
            rows.append([result.name, result.not_run] + [""] * 5)
            continue
        if reference is None or result is reference:
            step_difference = validation_difference = "(the reference)" if reference else "-"
        else:
            largest, at = worst_step(result, reference)
            step_difference = f"{largest:.2e} (step {at})"
            validation_difference = (
                f"{relative_difference(result.validation[1], reference.validation[1]):.2e}")
        rows.append([result.name, f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}",
                     f"{result.validation[0]:.4f} -> {result.validation[1]:.4f}",
                     step_difference, validation_difference, f"{result.overflowed}",
                     f"{result.seconds:.1f}"])
    print_table(["variant", "training loss, first -> last step", "validation, before -> after",
                 "largest step difference from torch", "validation difference from torch",
                 "steps the GradScaler skipped", "seconds, compiling included"], rows)


def print_times(results, timed_on):
    print(f"Time per training step, milliseconds. {timed_on} time by group from the profiler;"
          f" launches: {'kernels and memory copies' if timed_on == 'GPU' else 'operators'}"
          " per step.")
    rows = []
    for result in results:
        if result.not_run:
            continue
        profile = result.profile
        grouped = ([f"{sum(profile.groups.values()) / 1e3:.3f}", f"{profile.launches:.0f}"]
                   + [f"{profile.groups[group] / 1e3:.3f}" for group in kernel_groups.GROUPS]
                   if profile else ["-"] * (2 + len(kernel_groups.GROUPS)))
        rows.append([result.name, f"{result.wall:.3f}", f"{result.host:.3f}", *grouped])
    print_table(["variant", "wall", "host", f"{timed_on} total", "launches",
                 *kernel_groups.GROUPS], rows)


def print_units(result, timed_on):
    """The kernels (operators, on the CPU) that make up LISTED_SHARE of the time, largest
    first, with their groups: the grouping, decision by decision; the rest in one row."""
    unit = "kernel" if timed_on == "GPU" else "operator"
    total, listed, rows = sum(item.microseconds for item in result.profile.units), 0.0, []
    for item in result.profile.units:
        if listed >= LISTED_SHARE * total:
            rest = result.profile.units[len(rows):]
            rows.append([f"{sum(other.microseconds for other in rest):.1f}",
                         f"{sum(other.calls for other in rest):g}", "",
                         f"{len(rest)} more {unit}s"])
            break
        listed += item.microseconds
        rows.append([f"{item.microseconds:.1f}", f"{item.calls:g}", item.group,
                     f"`{item.name[:100]}`"])
    print(f"{result.name}: the {unit}s of a step, by {timed_on} time (microseconds per step)")
    print_table(["microseconds", "calls", "group", unit], rows)


def print_verdict_figures(results, device):
    """Each variant against torch's (and a compiled one against torch-compiled's): the
    figures a verdict is written from. A GPU run's only: the CPU runs the float64
    reference, whose times say nothing of the operator."""
    if device.type != "cuda":
        print("Figures for the verdict: a GPU run's only (on the CPU, the float64 reference).")
        return
    by_name = {result.name: result for result in results if result.not_run is None}
    print("Figures for the verdict: each variant over its peer; by group, its GPU "
          "milliseconds per step minus its peer's.")
    for result in by_name.values():
        peers = ["torch"] + (["torch-compiled"] if result.name.endswith(COMPILED) else [])
        for peer in (by_name[name] for name in peers if name in by_name):
            if peer is result:
                continue
            line = (f"{result.name} against {peer.name}: wall {result.wall / peer.wall:.3f}x "
                    f"({result.wall:.3f} / {peer.wall:.3f} ms), host "
                    f"{result.host / peer.host:.3f}x")
            if result.profile and peer.profile:
                mine, theirs = (run.profile.groups for run in (result, peer))
                line += f", GPU {sum(mine.values()) / sum(theirs.values()):.3f}x; " + ", ".join(
                    f"{group} {(mine[group] - theirs[group]) / 1e3:+.3f}"
                    for group in kernel_groups.GROUPS)
            print(line)
    if not model.day87_fast.layouts.reads_column_major_b(device):
        # The verdict is provisional while the layer makes this copy: the copy is then in
        # the fast variants' figures as well as the lesson's.
        print("PROVISIONAL: day87_fast.Linear copies weight.t() on this device "
              "(day87_fast/layouts.py), as the lesson variant does: its copies are in the "
              "fast variants' figures too.")
    print()


# ==== Provenance and output ====
def machine_name(device):
    """How fast/results/ names a machine: h100, h200, or here (this CPU machine)."""
    if device.type != "cuda":
        return "here"
    card = torch.cuda.get_device_name(device)
    return next((key.lower() for key in ("H100", "H200") if key in card), "gpu")


def checkout():
    """The lesson's folder's commit, and whether its files differ from it."""
    try:
        commit, changed = (subprocess.run(["git", "-C", LESSON, *command], capture_output=True,
                                          text=True, check=True).stdout.strip()
                           for command in (["rev-parse", "--short", "HEAD"],
                                           ["status", "--porcelain"]))
    except (OSError, subprocess.CalledProcessError):  # no git, or a copy without its history
        return "no git checkout"
    return f"commit {commit}{' with changes' if changed else ''}"


def card_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def provenance(device):
    now = datetime.datetime.now(datetime.timezone.utc)
    return (f"{now:%Y-%m-%d %H:%M:%S} UTC; {card_name(device)}; torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}; day87_fast {importlib.metadata.version('day87_fast')} "
            f"(built for {model.day87_fast.BUILD['architectures']}); the lesson's "
            f"{model.op.BUILD['library']}; {checkout()}")


class Tee:
    """stdout written to a log as well."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m day88.train", description="Day 88: a small transformer trained "
        "through nn.Linear, the lesson's operator and day87_fast.Linear, profiled down to the "
        "kernel (fast/day88/README.md).")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        choices=["cuda", "cpu"])
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)} "
                        "(default: all on a GPU, the first three on the CPU)")
    parser.add_argument("--steps", type=int, help="training steps a variant (default: "
                        f"{CONFIGS['cuda'].steps} on a GPU, {CONFIGS['cpu'].steps} on the CPU)")
    parser.add_argument("--batch", type=int, help="sequences a step (default: "
                        f"{CONFIGS['cuda'].batch} on a GPU, {CONFIGS['cpu'].batch} on the CPU)")
    parser.add_argument("--profile", action="store_true",
                        help="profile each variant's steps: time by kernel group")
    parser.add_argument("--out", help="a folder for the log and the picture")
    parser.add_argument("--picture", help="the picture's path (default: in --out)")
    parser.add_argument("--traces", action="store_true",
                        help="with --profile, each variant's Chrome trace in OUT/traces")
    arguments = parser.parse_args(argv)
    if arguments.device == "cuda" and not torch.cuda.is_available():
        parser.error("rule '--device': no CUDA device here; --device cpu runs the tiny "
                     "configuration")
    config = CONFIGS[arguments.device]
    variants = arguments.variants.split(",") if arguments.variants else config.variants
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        parser.error(f"rule 'variants': each one of {', '.join(VARIANTS)}; got {unknown}")
    for flag in ("steps", "batch"):
        if getattr(arguments, flag) is not None and getattr(arguments, flag) < 1:
            parser.error(f"rule '--{flag}': at least 1; got {getattr(arguments, flag)}")
    if arguments.traces and not (arguments.out and arguments.profile):
        parser.error("rule '--traces': needs --profile and --out")
    if arguments.traces and pathlib.Path(arguments.out).resolve().is_relative_to(
            pathlib.Path(LESSON).resolve()):
        parser.error(f"rule '--traces': Chrome traces stay out of the repository; --out "
                     f"{arguments.out} is inside {LESSON}")
    config = config._replace(steps=arguments.steps or config.steps,
                             batch=arguments.batch or config.batch)
    return arguments, config, variants


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    arguments, config, variants = parse(argv)
    device = torch.device(arguments.device)
    now = datetime.datetime.now(datetime.timezone.utc)  # results/ names its files in UTC
    stem = f"{machine_name(device)}-{now:%Y-%m-%d-%H%M}-day88-train"
    picture_path = arguments.picture or (arguments.out and
                                         os.path.join(arguments.out, f"{stem}.svg"))
    with contextlib.ExitStack() as stack:
        if arguments.out:
            os.makedirs(arguments.out, exist_ok=True)
            log = stack.enter_context(open(os.path.join(arguments.out, f"{stem}.log"), "w"))
            stack.enter_context(contextlib.redirect_stdout(Tee(sys.stdout, log)))
        status = run(argv, arguments, config, variants, device, picture_path)
    return status


def run(argv, arguments, config, variants, device, picture_path):
    started = time.perf_counter()
    if device.type == "cpu":
        # The tiny configuration's products are too small to share out between threads,
        # and where the cores are busy with other work, threads that wait on each other
        # made the same run several times slower: one thread keeps it to seconds.
        torch.set_num_threads(1)
    print(f"day88.train {' '.join(argv)}: {provenance(device)}")
    corpus = model.read_corpus()
    print(f"corpus: {corpus.files} Markdown and Python files, {len(corpus.train)} characters "
          f"to train on and {len(corpus.validation)} held out, sha256 {corpus.digest[:16]}; "
          f"vocabulary {corpus.vocabulary} characters, "
          f"{'not ' if corpus.vocabulary % 128 else ''}a multiple of 128")
    print(f"model: {config.layers} blocks of width {config.width}, {config.heads} heads, "
          f"sequence {config.sequence}, batch {config.batch} (M = {config.batch * config.sequence}"
          f" rows), {str(config.dtype).removeprefix('torch.')} parameters"
          f"{', FP16 autocast' if device.type == 'cuda' else ''}; {config.steps} steps, "
          f"AdamW at {config.learning_rate:g}; timed: {config.timed} steps (wall), "
          f"{config.host} (host), {config.profiled} (profiled)")
    initial_state = initial_weights(config, corpus.vocabulary)
    traces = arguments.traces and os.path.join(arguments.out, "traces")
    results = [train_variant(name, config, corpus, initial_state, device, arguments.profile,
                             traces) for name in variants]
    print()
    tolerance = TOLERANCES[device.type]
    timed_on = "GPU" if device.type == "cuda" else "CPU"
    print_losses(results, tolerance)
    print_times(results, timed_on)
    if arguments.profile:
        for result in results:
            if result.not_run is None:
                print_units(result, timed_on)
    print_verdict_figures(results, device)
    if picture_path:
        drawn = [picture.Drawn(result.name, result.profile and {
                     group: microseconds / 1e3 for group, microseconds
                     in result.profile.groups.items()}, result.wall, result.losses)
                 for result in results if result.not_run is None]
        title = (f"day 88: {config.layers} x {config.width}, sequence {config.sequence}, batch "
                 f"{config.batch}, {config.steps} steps; {card_name(device)}")
        pathlib.Path(picture_path).write_text(picture.training_svg(title, timed_on, drawn))
        print(f"picture: {picture_path}")
    failures = failed_checks(results, tolerance)
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"{'FAILED' if failures else 'passed'}: the loss falls, and equals torch's; "
          f"{time.perf_counter() - started:.0f} s in all")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

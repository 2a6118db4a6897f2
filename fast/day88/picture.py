"""picture.py: day 88's run as one SVG: per variant, a stacked bar of the step's time by
kernel group beside a bar of the step's wall time; and every variant's loss curve.
Standard library only, as bench/forward_picture.py: drawn, and tested, without matplotlib,
a GPU or torch.

    from day88 import picture     (from fast/)
    svg = picture.training_svg("title", "GPU", [Drawn("torch", groups, 10.2, losses), ...])
"""

import math
from typing import NamedTuple, Optional

from bench.forward_picture import COLORS, _escape
from day88.kernel_groups import GROUPS

WIDTH, HEIGHT = 1040, 520
# Two plots side by side, each with room for its axis labels; the legends go beneath.
BARS_LEFT, BARS_RIGHT, CURVES_LEFT, CURVES_RIGHT = 70, 500, 600, 1010
TOP, BOTTOM = 50, 330
WALL_COLOR = "#555555"
# A curve's color is its layer's, none a group's; a compiled variant's curve is dashed.
LAYER_COLORS = {"torch": "#000000", "lesson": "#d95f02", "fast": "#1b9e77"}
OTHER_LAYER_COLOR = "#7570b3"
COMPILED_DASH = "6 3"


def curve_style(name):
    """(color, dash or None) of a variant's curve, by its name: "fast-compiled"."""
    layer, _, compiled = name.partition("-")
    return LAYER_COLORS.get(layer, OTHER_LAYER_COLOR), COMPILED_DASH if compiled else None


class Drawn(NamedTuple):
    """One variant: its name, {group: milliseconds per step} (None where it was not
    profiled), its step's wall time in milliseconds, and its training loss at each step."""
    name: str
    groups: Optional[dict]
    wall: float
    losses: list


def tick_step(largest):
    """1, 2 or 5 times a power of ten: the step that puts about five ticks up to `largest`."""
    rough = largest / 5
    power = 10 ** math.floor(math.log10(rough))
    return next(multiple * power for multiple in (1, 2, 5, 10) if multiple * power >= rough)


def ticks(low, high):
    """Tick values covering [low, high], a tick_step apart, from a multiple of it."""
    step = tick_step(high - low or abs(high) or 1.0)  # a flat curve still gets a scale
    first = math.floor(low / step) * step
    count = math.ceil((high - first) / step)
    return [first + index * step for index in range(count + 1)]


def training_svg(title, timed_on, variants):
    """title: str; timed_on: "GPU" or "CPU", the time the bars stack; variants: Drawn.
    Returns the SVG document as a str."""
    for variant in variants:
        figures = [variant.wall, *(variant.groups or {}).values()]
        if any(not math.isfinite(value) or value < 0 for value in figures):
            raise ValueError(f"day88: rule 'picture': times must be finite and >= 0; "
                             f"{variant.name} has {figures}")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             'font-family="sans-serif" font-size="12">',
             f'<text x="{WIDTH / 2}" y="24" font-size="15" font-weight="bold" '
             f'text-anchor="middle">{_escape(title)}</text>']
    parts += _bars(timed_on, variants)
    parts += _curves(variants)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _bars(timed_on, variants):
    stacked = [sum((variant.groups or {}).values()) for variant in variants]
    scale = ticks(0, max([*stacked, *(variant.wall for variant in variants), 1e-3]))
    top = scale[-1]

    def y_of(milliseconds):
        return BOTTOM - milliseconds / top * (BOTTOM - TOP)

    parts = [f'<text transform="translate(18 {(TOP + BOTTOM) / 2}) rotate(-90)" '
             'text-anchor="middle">milliseconds per training step</text>']
    parts += _horizontal_grid(scale, y_of, BARS_LEFT, BARS_RIGHT, "{:g}")
    slot = (BARS_RIGHT - BARS_LEFT) / len(variants)
    bar = slot * 0.35  # two bars a variant, and a gap
    for index, variant in enumerate(variants):
        x = BARS_LEFT + index * slot + slot * 0.1
        bottom = BOTTOM
        for group_index, group in enumerate(GROUPS):
            milliseconds = (variant.groups or {}).get(group, 0.0)
            if milliseconds <= 0:
                continue
            height = milliseconds / top * (BOTTOM - TOP)
            parts.append(f'<rect x="{x:.1f}" y="{bottom - height:.1f}" width="{bar:.1f}" '
                         f'height="{height:.1f}" fill="{COLORS[group_index]}"><title>'
                         f'{_escape(variant.name)}: {group} {milliseconds:.3f} ms</title></rect>')
            bottom -= height
        y = y_of(variant.wall)
        parts.append(f'<rect x="{x + bar:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                     f'height="{BOTTOM - y:.1f}" fill="{WALL_COLOR}"><title>'
                     f'{_escape(variant.name)}: wall {variant.wall:.3f} ms</title></rect>')
        label_x, label_y = x + bar, BOTTOM + 14
        parts.append(f'<text x="{label_x:.1f}" y="{label_y}" font-size="11" text-anchor="end" '
                     f'transform="rotate(-30 {label_x:.1f} {label_y})">'
                     f'{_escape(variant.name)}</text>')
    parts.append(f'<line x1="{BARS_LEFT}" y1="{BOTTOM}" x2="{BARS_RIGHT}" y2="{BOTTOM}" '
                 'stroke="black"/>')
    legend = [(f"{timed_on} time: {group}", COLORS[index], None)
              for index, group in enumerate(GROUPS)]
    return parts + _legend(legend + [("step wall time", WALL_COLOR, None)], BARS_LEFT)


def _curves(variants):
    losses = [loss for variant in variants for loss in variant.losses]
    steps = max(len(variant.losses) for variant in variants)
    scale = ticks(min(losses), max(losses))
    low, high = scale[0], scale[-1]

    def x_of(step):  # steps count from 1
        return CURVES_LEFT + (step - 1) / max(steps - 1, 1) * (CURVES_RIGHT - CURVES_LEFT)

    def y_of(loss):
        return BOTTOM - (loss - low) / (high - low) * (BOTTOM - TOP)

    parts = [f'<text transform="translate({CURVES_LEFT - 45} {(TOP + BOTTOM) / 2}) rotate(-90)" '
             'text-anchor="middle">training loss (nats per character)</text>',
             f'<text x="{(CURVES_LEFT + CURVES_RIGHT) / 2}" y="{BOTTOM + 36}" '
             'text-anchor="middle">step</text>']
    parts += _horizontal_grid(scale, y_of, CURVES_LEFT, CURVES_RIGHT, "{:.3g}")
    for step in [1] + [tick for tick in ticks(0, steps) if 1 < tick <= steps]:
        parts.append(f'<text x="{x_of(step):.1f}" y="{BOTTOM + 16}" text-anchor="middle">'
                     f'{step:g}</text>')
    for index, variant in enumerate(variants):
        points = " ".join(f"{x_of(step):.1f},{y_of(loss):.1f}"
                          for step, loss in enumerate(variant.losses, start=1))
        # Each curve a little narrower than the one before, drawn over it: curves that
        # coincide (float64 on the CPU) show as stripes, none hidden.
        width = 1.0 + 0.6 * (len(variants) - 1 - index)
        color, dash = curve_style(variant.name)
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<polyline points="{points}" fill="none" stroke-width="{width:.1f}" '
                     f'stroke="{color}"{dashed}><title>{_escape(variant.name)}</title></polyline>')
    return parts + _legend([(variant.name, *curve_style(variant.name)) for variant in variants],
                           CURVES_LEFT)


def _horizontal_grid(scale, y_of, left, right, label):
    parts = []
    for value in scale:
        y = y_of(value)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{label.format(value)}</text>')
    return parts


def _legend(entries, left):
    """(text, color, dash) entries in two columns under a plot: a swatch for a bar's group,
    a line for a dashed curve."""
    parts = []
    for index, (text, color, dash) in enumerate(entries):
        x, y = left + (index % 2) * 210, BOTTOM + 70 + (index // 2) * 20
        if dash:
            parts.append(f'<line x1="{x}" y1="{y + 7}" x2="{x + 14}" y2="{y + 7}" '
                         f'stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        else:
            parts.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{color}"/>')
        parts.append(f'<text x="{x + 20}" y="{y + 12}">{_escape(text)}</text>')
    return parts

"""forward_picture.py: bench.py's forward table (table A) as a picture, an SVG of
grouped bars: GPU TF/s by shape, one bar per line of the table, on a log scale, with the
card's dense FP16 tensor-core peak as a dashed line. Standard library only, so that the
picture can be drawn, and tested, where there is no GPU and no torch.

bench.py writes it with --picture PATH.
"""

import math

# The dense FP16 tensor-core peak (FP32 accumulate) of the cards this project names,
# TF/s, by a substring of torch.cuda.get_device_name(), each with its source. The more
# specific keys come first: "H100 PCIe" must match before "H100", "H200 NVL" before "H200".
DENSE_FP16_PEAKS = [
    # NVIDIA H200 datasheet, NVL: 1,671 TF/s FP16 with sparsity, half that dense
    ("H200 NVL", 835.5),
    # NVIDIA H200 datasheet, SXM: 1,979 TF/s FP16 with sparsity, half that dense
    ("H200", 989.4),
    # NVIDIA H100 datasheet, PCIe: 1,513 TF/s FP16 with sparsity, half that dense
    ("H100 PCIe", 756.5),
    # NVIDIA H100 datasheet, SXM: 1,979 TF/s FP16 with sparsity, half that dense
    ("H100", 989.4),
    # NVIDIA A100 datasheet: FP16 tensor core 312 TF/s dense
    ("A100", 312.0),
    # NVIDIA T4 datasheet: 65 TF/s mixed precision FP16/FP32
    ("T4", 65.0),
]

WIDTH, HEIGHT = 960, 480
# The plot's box; the legend takes the room to its right.
LEFT, RIGHT, TOP, BOTTOM = 70, 740, 50, 420
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]


def dense_fp16_peak(device_name):
    """(label, tflops) for the first entry whose key is in device_name, else None."""
    for key, tflops in DENSE_FP16_PEAKS:
        if key in device_name:
            return f"{key} dense FP16 peak, {tflops:.0f} TF/s", tflops
    return None


def forward_svg(title, shapes, series, peak=None):
    """title: str; shapes: list of str labels, e.g. "256x512x384" (M x N x K);
    series: list of (name, values) with values a list of floats (TF/s) or None (not
    measured) per shape, in the order of `shapes`; peak: None or (label, tflops), the
    card's dense FP16 tensor peak drawn as a horizontal dashed line labelled with its label.
    Returns the SVG document as a str."""
    for name, values in series:
        for shape, value in zip(shapes, values):
            if value is not None and value <= 0:
                raise ValueError(f"{name} at {shape}: {value} TF/s; a log scale needs values > 0")
    measured = [value for _, values in series for value in values if value is not None]
    measured += [peak[1]] if peak else []
    # Whole decades, so that the gridlines at 1, 3, 10, ... fall inside the plot.
    low = math.floor(math.log10(min(measured, default=1.0)))
    high = max(math.ceil(math.log10(max(measured, default=10.0))), low + 1)

    def y_of(tflops):
        return BOTTOM - (math.log10(tflops) - low) / (high - low) * (BOTTOM - TOP)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             'font-family="sans-serif" font-size="12">',
             f'<text x="{WIDTH / 2}" y="24" font-size="15" font-weight="bold" '
             f'text-anchor="middle">{_escape(title)}</text>',
             f'<text transform="translate(18 {(TOP + BOTTOM) / 2}) rotate(-90)" '
             'text-anchor="middle">GPU TF/s (log scale)</text>']
    for decade in range(low, high + 1):
        for tick in (10 ** decade, 3 * 10 ** decade):
            if tick <= 10 ** high:
                y = y_of(tick)
                parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{RIGHT}" y2="{y:.1f}" '
                             'stroke="#ddd"/>')
                parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                             f'{tick:g}</text>')
    group = (RIGHT - LEFT) / len(shapes)
    # A fifth of each group left empty keeps the groups apart.
    bar = group * 0.8 / len(series)
    for column, shape in enumerate(shapes):
        start = LEFT + column * group + group * 0.1
        parts.append(f'<text x="{start + group * 0.4:.1f}" y="{BOTTOM + 18}" font-size="11" '
                     f'text-anchor="middle">{_escape(shape)}</text>')
        for index, (name, values) in enumerate(series):
            value = values[column]
            if value is None:
                continue
            x, y = start + index * bar, y_of(value)
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                         f'height="{BOTTOM - y:.1f}" fill="{COLORS[index % len(COLORS)]}">'
                         f'<title>{_escape(name)} at {_escape(shape)}: {value:.1f} TF/s</title>'
                         '</rect>')
    parts.append(f'<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" stroke="black"/>')
    if peak:
        label, tflops = peak
        y = y_of(tflops)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{RIGHT}" y2="{y:.1f}" stroke="black" '
                     'stroke-dasharray="6 4"/>')
        parts.append(f'<text x="{RIGHT}" y="{y - 5:.1f}" text-anchor="end">'
                     f'{_escape(label)}</text>')
    for index, (name, _) in enumerate(series):
        y = TOP + index * 22
        parts.append(f'<rect x="{RIGHT + 20}" y="{y}" width="14" height="14" '
                     f'fill="{COLORS[index % len(COLORS)]}"/>')
        parts.append(f'<text x="{RIGHT + 40}" y="{y + 12}">{_escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

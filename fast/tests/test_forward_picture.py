"""test_forward_picture.py: forward_picture.py's SVG of the forward table, read back as
XML: one bar per measured value, heights on a log scale, the peak line, escaped text;
and the peak table's lookups (no GPU and no torch needed).

    cd fast && python -m pytest tests/test_forward_picture.py
"""

import math
import xml.etree.ElementTree as ElementTree

import pytest

from bench.forward_picture import dense_fp16_peak, forward_svg

SVG = "{http://www.w3.org/2000/svg}"
SHAPES = ["256x512x384", "2048x2048x2048", "8192x8192x8192"]
PEAK = ("H200 dense FP16 peak, 989 TF/s", 989.4)


def bars(document):
    """{tooltip: height} for each bar: a rect with a <title> (the legend's have none)."""
    root = ElementTree.fromstring(document)
    return {rect.find(SVG + "title").text: float(rect.get("height"))
            for rect in root.iter(SVG + "rect") if rect.find(SVG + "title") is not None}


def texts(document):
    return [text.text for text in ElementTree.fromstring(document).iter(SVG + "text")]


def lines(document):
    return list(ElementTree.fromstring(document).iter(SVG + "line"))


def test_one_bar_per_measured_value():
    series = [("fast", [10.0, 100.0, 1000.0]), ("cuBLAS", [20.0, None, 700.0])]
    heights = bars(forward_svg("forward", SHAPES, series))
    assert len(heights) == 5
    assert not any(tooltip.startswith("cuBLAS at 2048x2048x2048") for tooltip in heights)
    assert "cuBLAS at 8192x8192x8192: 700.0 TF/s" in heights


def test_heights_follow_the_values_on_a_log_scale():
    series = [("fast", [10.0, 100.0, 1000.0]), ("cuBLAS", [30.0, 300.0, 3.0])]
    heights = bars(forward_svg("forward", SHAPES, series))
    ten, hundred, thousand = (heights[f"fast at {shape}: {value:.1f} TF/s"]
                              for shape, value in zip(SHAPES, (10.0, 100.0, 1000.0)))
    three, thirty = heights["cuBLAS at 8192x8192x8192: 3.0 TF/s"], \
        heights["cuBLAS at 256x512x384: 30.0 TF/s"]
    assert three < ten < thirty < hundred < thousand
    # A ratio of 10 is the same step in height wherever it falls.
    assert math.isclose(hundred - ten, thousand - hundred, abs_tol=0.2)
    assert math.isclose(thirty - three, hundred - ten, abs_tol=0.2)


def test_gridlines_at_one_and_three_per_decade():
    document = forward_svg("forward", SHAPES, [("fast", [12.0, 150.0, 900.0])])
    assert {"10", "30", "100", "300", "1000"} <= set(texts(document))
    assert "GPU TF/s (log scale)" in texts(document)


def test_the_peak_line_when_given():
    series = [("fast", [10.0, 100.0, 500.0])]
    with_peak, without = forward_svg("forward", SHAPES, series, PEAK), \
        forward_svg("forward", SHAPES, series)
    dashed = [line for line in lines(with_peak) if line.get("stroke-dasharray")]
    assert len(dashed) == 1 and PEAK[0] in texts(with_peak)
    assert not any(line.get("stroke-dasharray") for line in lines(without))
    assert PEAK[0] not in texts(without)


def test_text_is_escaped():
    document = forward_svg("a < b & c", SHAPES, [("a<b&c", [10.0, 20.0, 30.0])])
    assert "a<b&c" in texts(document) and "a < b & c" in texts(document)
    assert "a<b&c at 256x512x384: 10.0 TF/s" in bars(document)


@pytest.mark.parametrize("value", [0.0, -5.0])
def test_a_value_not_above_zero_is_refused(value):
    with pytest.raises(ValueError, match=r"cuBLAS at 2048x2048x2048"):
        forward_svg("forward", SHAPES, [("fast", [1.0, 2.0, 3.0]), ("cuBLAS", [1.0, value, 3.0])])


@pytest.mark.parametrize("device_name, tflops", [
    ("NVIDIA H200", 989.4),
    ("NVIDIA H100 PCIe", 756.5),
    ("NVIDIA H100 80GB HBM3", 989.4),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("Tesla T4", 65.0),
])
def test_the_peak_of_a_named_card(device_name, tflops):
    label, peak = dense_fp16_peak(device_name)
    assert peak == tflops and f"{tflops:.0f} TF/s" in label


def test_the_label_drawn():
    assert dense_fp16_peak("NVIDIA H200")[0] == "H200 dense FP16 peak, 989 TF/s"


def test_an_unknown_card_has_no_peak():
    assert dense_fp16_peak("NVIDIA GeForce RTX 4090") is None

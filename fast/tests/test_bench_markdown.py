"""pytest: bench.py's tables as Markdown: one column per implementation, one row per
figure, every figure of every line in its cell (no GPU needed: the figures are made up).

    cd fast && python -m pytest -q tests/test_bench_markdown.py
"""

from bench import bench, timing


def lines():
    return [bench.Line("lesson", "op.wmma_mm(a, b)", None, None),
            bench.Line("fast", "day87_fast.wmma_mm(a, b)", None, None, "auto"),
            bench.Line("fast", "  DAY87_FAST_KERNEL=wmma", None, None, "wmma"),
            bench.Line("fp16", "grad @ w.t()", None, None),
            bench.Line("fp16", "x.t() @ grad", None, None)]


def test_one_column_per_implementation_one_row_per_figure(capsys, monkeypatch):
    monkeypatch.setattr(bench, "device_line", lambda: "device: none")
    table = bench.MarkdownTable("Table X")
    for shape in ("M=1 N=2 K=3", "M=4 N=5 K=6"):
        timings = [[timing.Figures(10.0 + index, 20.0 + index, 1.0 + index),
                    timing.Figures(10.0 + index, 20.0 + index, 2.0 + index)]
                   for index in range(5)]
        table.add(shape, lines(), timings, [f"error {index}" for index in range(5)])
    table.print()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["figure", "lesson", "fast", "fast (wmma)", "fp16: grad @ w.t()",
                      "fp16: x.t() @ grad"]
    figures = {row.split("|")[1].strip(): [cell.strip() for cell in row.strip("|").split("|")[1:]]
               for row in rows[2:]}
    assert len(figures) == 2 * 5, "two shapes, five figures each"
    assert figures["M=4 N=5 K=6, GPU us"] == ["1.00", "2.00", "3.00", "4.00", "5.00"]
    assert figures["M=4 N=5 K=6, GPU us, reversed"] == ["2.00", "3.00", "4.00", "5.00", "6.00"]
    assert figures["M=1 N=2 K=3, host us"] == ["20.0", "21.0", "22.0", "23.0", "24.0"]
    assert figures["M=1 N=2 K=3, error vs float64"][4] == "error 4"

"""Graphviz export: `graph.to_dot()` (kernels as clusters) and `tg.ir.render`."""

import os
import stat
import sys

import pytest

import tracegrad as tg
from tracegrad.codegen.program_builder import build_numpy_program
from tracegrad.ir.graph import Graph


def _graph():
    x = tg.randn(4, 3, requires_grad=True)
    w = tg.randn(3, 2, requires_grad=True)
    y = ((x @ w).tanh() * 2.0).sum()
    return Graph.from_outputs([y._value], name="eager")


def test_to_dot_is_a_digraph_with_one_box_per_node():
    graph = _graph()
    text = graph.to_dot()
    assert text.startswith('digraph "eager" {') and text.endswith("}")
    for i, node in enumerate(graph.nodes):
        assert f"  n{i} [label=" in text and node.op.name in text


def test_to_dot_draws_an_edge_per_operand():
    graph = _graph()
    text = graph.to_dot(kernels=False)
    edges = [line for line in text.splitlines() if "->" in line and "return" not in line]
    assert len(edges) == sum(len(node.inputs) for node in graph.nodes)


def test_to_dot_groups_each_fused_kernel_in_a_cluster():
    graph = _graph()
    text = graph.to_dot()
    # matmul runs through NumPy; tanh, mul and the sum fuse into kernels after it
    assert text.count("subgraph cluster_") >= 1
    cluster = text[text.index("subgraph cluster_0"):]
    matmul = next(i for i, n in enumerate(graph.nodes) if n.op.name == "matmul")
    tanh = next(i for i, n in enumerate(graph.nodes) if n.op.name == "tanh")
    members = cluster[:cluster.index("}")]
    assert f"n{tanh}" in members and f"n{matmul}" not in members


def test_to_dot_without_kernels_has_no_clusters():
    assert "subgraph" not in _graph().to_dot(kernels=False)


def test_to_dot_shows_input_names_and_types():
    assert 'label="%leaf0: f32[4,3]"' in _graph().to_dot()


def test_render_without_graphviz_raises_with_install_instructions(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` there
    with pytest.raises(tg.ir.GraphvizNotFoundError, match="apt-get install graphviz"):
        tg.ir.render(_graph(), str(tmp_path / "graph.svg"))


def test_render_runs_dot_with_the_format_of_the_file_extension(tmp_path, monkeypatch):
    fake_dot = tmp_path / "dot"
    fake_dot.write_text(f"#!{sys.executable}\n"
                        "import sys\n"
                        "args = sys.argv[1:]\n"
                        "text = sys.stdin.read()\n"
                        "open(args[args.index('-o') + 1], 'w').write(args[0] + '\\n' + text)\n")
    fake_dot.chmod(fake_dot.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    graph = _graph()
    target = tmp_path / "graph.png"
    tg.ir.render(graph, str(target))
    assert target.read_text() == "-Tpng\n" + graph.to_dot()


def test_render_to_a_dot_file_needs_no_graphviz(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    target = tmp_path / "graph.dot"
    tg.ir.render(_graph(), str(target))
    assert target.read_text().startswith('digraph "eager"')


def test_render_accepts_a_tensor_with_a_recorded_graph(tmp_path):
    x = tg.randn(3, requires_grad=True)
    target = tmp_path / "y.dot"
    tg.ir.render(x.exp(), str(target))
    assert "exp" in target.read_text()


def test_explain_report_draws_its_optimized_graph_with_named_kernels():
    compiled = tg.compile(lambda x: (x.exp() * 2.0).sum())
    report = compiled.explain(tg.ones(8))
    text = report.to_dot()
    kernel_names = [k.name for k in report.graphs[-1].kernels if k.is_llvm]
    assert kernel_names and all(f'label="{name}"' in text for name in kernel_names)


def test_numpy_only_program_report_has_no_clusters():
    compiled = tg.compile(lambda x: x.exp(), builder=build_numpy_program)
    assert "subgraph" not in compiled.explain(tg.ones(2)).to_dot()

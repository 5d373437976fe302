"""The profile format without torch: what Python writes, core's parser (in the native module)
reads back equal, and a format error names its line."""

import pytest

from syncopate import _native, profile_format
from syncopate.profile_format import Layer, Profile


def sample() -> Profile:
    layers = [
        Layer("conv1", "Conv2d(3, 16, kernel_size=(3, 3))", 0.412, 0.83, [432, 16]),
        Layer("relu", "ReLU()", 0.0125, 0.02, []),
        Layer("fc", "Linear(16, 10)", 0.1, 0.2, [170]),
    ]
    return Profile("tiny", layers, batch_size=32, comments=["measured by hand"])


def test_what_python_writes_the_native_parser_reads_back_equal(tmp_path):
    written = sample()
    path = tmp_path / "other-name.graph.txt"
    written.write(path)
    assert profile_format.read(path) == written
    raw = _native.parse_profile(path.read_text(), "ignored")
    assert raw["name"] == "tiny" and raw["batch_size"] == 32
    assert raw["comments"] == ["measured by hand"]
    assert [layer["forward_ns"] for layer in raw["layers"]] == [412_000, 12_500, 100_000]
    assert [layer["tensors"] for layer in raw["layers"]] == [[432, 16], [], [170]]
    assert written.keys() == [(0, 432), (0, 16), (2, 170)]


def test_the_name_comes_from_the_file_without_a_model_line(tmp_path):
    path = tmp_path / "m.graph.txt"
    path.write_text("n1 -- A -- forward_compute_time=1, backward_compute_time=2, parameter_size=8\n")
    got = profile_format.read(path)
    assert (got.name, got.batch_size, got.layers[0].tensors) == ("m", None, [2])


def test_format_errors_name_the_line():
    node = "n -- A -- forward_compute_time=1, backward_compute_time=1"
    cases = [
        (f"{node}, parameter_size=12, parameter_tensors=2;2", 1, "sum to 4 values"),
        (f"#\n{node}, parameter_size=8, parameter_tensors=2;0", 2, "parameter_tensors"),
        (f"# parameters: 3\n{node}, parameter_size=8", 1, "header says 3 parameters"),
        (f"{node}, parameter_size=6", 1, "multiple of 4"),
        (f"{node}", 1, "missing field `parameter_size`"),
        (f"{node}, parameter_size=8\n\tn -- m", 2, "unknown node 'm'"),
        ("# only a comment", 0, "no nodes"),
    ]
    for text, line, what in cases:
        with pytest.raises(profile_format.ProfileFormatError) as e:
            profile_format.parse(text)
        assert e.value.line == line and what in str(e.value), (text, str(e.value))

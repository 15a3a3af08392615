"""``softcert vnncomp MODEL PROPERTY`` given a VNN-LIB 2.0 property that declares several
networks (issue 33): MODEL is one network, so the property is read when every other network
is ``(equal-to FIRST)`` (MODEL again, one product graph), and refused otherwise with exit 2
and an error naming the property file and the ``softcert vnnlib verify --network NAME=FILE``
command that takes a file per network; never a traceback, never a result file.

Models and answers as in tests/test_vnnlib_networks.py: f - f = 0 on equated inputs."""
from __future__ import annotations

import subprocess

from test_vnnlib_interface import SOFTCERT
from test_vnnlib_networks import APART, query, relu_model

from softcert.cli import main


def test_equal_to_networks_are_one_model(tmp_path):
    model = relu_model(tmp_path / "f.onnx")
    (tmp_path / "q.vnnlib").write_text(query("equal-to", APART))
    out = tmp_path / "result.txt"
    assert main(["vnncomp", str(model), str(tmp_path / "q.vnnlib"), "--timeout", "60", "--out", str(out)]) == 0
    assert out.read_text() == "unsat\n"
    # a counterexample names the flat X (the equated inputs once) and Y (both networks' outputs)
    (tmp_path / "s.vnnlib").write_text(query("equal-to", "(>= (+ Y[0,0] C[0,0]) 2.6)"))
    assert main(["vnncomp", str(model), str(tmp_path / "s.vnnlib"), "--timeout", "60", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("sat\n") and "(X_1 " in text and "(X_2 " not in text and "(Y_3 " in text


def test_networks_with_their_own_models_are_refused_by_name(tmp_path, capsys):
    model = relu_model(tmp_path / "f.onnx")
    prop = tmp_path / "q.vnnlib"
    prop.write_text(query("isomorphic-to", APART))
    out = tmp_path / "result.txt"
    assert main(["vnncomp", str(model), str(prop), "--timeout", "60", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{prop}: declares 2 networks, and g is not (equal-to f)" in err
    assert f"Use: softcert vnnlib verify {prop} --network f=FILE --network g=FILE --timeout 60" in err
    assert not out.exists()


def test_the_refusal_is_no_traceback_in_the_process(tmp_path):
    """The command as a harness runs it (the watchdog armed): exit 2, one error line."""
    model = relu_model(tmp_path / "f.onnx")
    prop = tmp_path / "q.vnnlib"
    prop.write_text(query("isomorphic-to", APART))
    p = subprocess.run([*SOFTCERT, "vnncomp", str(model), str(prop), "--timeout", "60", "--out",
                        str(tmp_path / "r.txt")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and not p.stdout and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and "softcert vnnlib verify" in p.stderr

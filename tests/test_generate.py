"""gdnconv generate: the real-model demo, and its message where transformers is missing."""
import pytest

from conftest import run_python


def test_generate_without_transformers_says_how_to_install():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "from gdnconv.__main__ import main\n"
            "rc = main(['generate']); print('rc', rc)")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert 'pip install torch "transformers>=5.19,<5.24"' in r.stdout and 'pip install ".[transformers]"' in r.stdout
    assert "rc 2" in r.stdout


@pytest.mark.parametrize("model", ["qwen3_next", "lfm2"])
def test_generate_runs_and_agrees(model, capsys):
    pytest.importorskip("transformers")
    from gdnconv.__main__ import main
    rc = main(["generate", "--model", model, "--hidden", "64", "--layers", "2", "--new-tokens", "6",
               "--prompt-len", "4", "--batch", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "tokens identical" in out and "fallbacks: 0" in out and "conv calls routed through gdnconv: 5" in out
    assert out.count("decode tokens/s") == 2


def test_generate_flags_a_busy_machine(monkeypatch, capsys):
    """Other processes' CPU time during a timed run is shown on that run's line, and a warning
    closes the report, as in gdnconv simulate."""
    pytest.importorskip("transformers")
    from gdnconv import generate
    from gdnconv.__main__ import main
    monkeypatch.setattr(generate.CpuMeter, "others_pct", lambda self, a, b: 150.0)
    rc = main(["generate", "--model", "mamba2", "--hidden", "64", "--layers", "2", "--new-tokens", "3",
               "--prompt-len", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("[other processes: 150% of a CPU]") == 2, out
    assert out.splitlines()[-1].startswith("WARNING: other processes used up to 150% of a CPU"), out

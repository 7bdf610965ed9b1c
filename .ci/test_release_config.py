"""The release configuration parses and says what we intend: cibuildwheel's identifiers
(CPython 3.10-3.13, manylinux x86_64 and aarch64), a test pass on the portable kernel,
torch from the CPU index, and a workflow that runs both wheel jobs and the sdist job.

Run from the repository root (``.ci/run`` does): needs cibuildwheel and PyYAML, no
containers (``--print-build-identifiers`` only reads the configuration).
"""
import os
import subprocess
import sys
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHONS = ["cp310", "cp311", "cp312", "cp313"]


def _identifiers(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    r = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers",
                        "--platform", "linux", *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _config():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["cibuildwheel"]


def test_identifiers_for_both_architectures():
    want = [f"{py}-manylinux_{arch}" for py in PYTHONS for arch in ("x86_64", "aarch64")]
    assert sorted(_identifiers("--archs", "x86_64,aarch64")) == sorted(want)


def test_configured_archs_are_x86_64_and_aarch64():
    assert _config()["archs"] == ["x86_64", "aarch64"]
    # without --archs: the configured ones (aarch64 needs emulation on an x86-64 host)
    want = [f"{py}-manylinux_{arch}" for py in PYTHONS for arch in ("x86_64", "aarch64")]
    assert sorted(_identifiers()) == sorted(want)


def test_manylinux_2_28_images():
    cfg = _config()
    assert cfg["manylinux-x86_64-image"] == "manylinux_2_28"
    assert cfg["manylinux-aarch64-image"] == "manylinux_2_28"


def test_wheel_tests_install_torch_cpu_and_run_the_portable_kernel():
    cfg = _config()
    assert cfg["test-extras"] == ["test"]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    assert "torch==2.13.0" in extras
    assert cfg["test-environment"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert cfg["test-sources"] == ["tests"]
    commands = cfg["test-command"]
    assert len(commands) == 2 and all("pytest" in c and " -x" not in c for c in commands)
    assert commands[1].startswith("GDNCONV_ISA=scalar ") and " -k " not in commands[1]


def test_workflow_runs_wheels_per_arch_and_sdist():
    with open(os.path.join(ROOT, ".github", "workflows", "wheels.yml")) as f:
        wf = yaml.safe_load(f)
    jobs = wf["jobs"]
    wheel_steps = jobs["wheels"]["steps"]
    cibw = [s for s in wheel_steps if "cibuildwheel" in str(s.get("uses", ""))]
    assert len(cibw) == 1, wheel_steps
    archs = {e["arch"] for e in jobs["wheels"]["strategy"]["matrix"]["include"]}
    assert archs == {"x86_64", "aarch64"}
    sdist_runs = " ".join(str(s.get("run", "")) for s in jobs["sdist"]["steps"])
    assert "build --sdist" in sdist_runs


def test_transformers_extra_and_ci_cover_the_supported_range():
    """The transformers extra pins gdnconv.transformers.SUPPORTED_TRANSFORMERS; the test extra
    installs a release inside it, and .ci/run reruns the real-model tests on its lower bound."""
    import ast
    with open(os.path.join(ROOT, "src", "gdnconv", "transformers.py")) as f:
        tree = ast.parse(f.read())
    supported = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and getattr(n.targets[0], "id", None) == "SUPPORTED_TRANSFORMERS")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert f"transformers{','.join(supported)}" in extras["transformers"]
    lowest = supported[0].removeprefix(">=")
    pinned = [e.removeprefix("transformers==") for e in extras["test"] if e.startswith("transformers==")]
    from packaging.specifiers import SpecifierSet
    assert len(pinned) == 1 and pinned[0] != lowest and pinned[0] in SpecifierSet(",".join(supported)), extras["test"]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert f'pip install -q "transformers=={lowest}"' in f.read()

"""setup.py's OpenMP probe: it checks OpenMP with the build's own flags (CFLAGS and
LDFLAGS included), fails loudly when OpenMP does not work, and GDNCONV_NO_OPENMP=1
builds without it."""
import os
import shutil

import pytest

from conftest import run_python

SETUP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")

PROBE = """
import runpy, shutil
import setuptools
from distutils.ccompiler import new_compiler
from distutils.sysconfig import customize_compiler
cc = new_compiler()
customize_compiler(cc)
if cc.compiler_type == "msvc" or not shutil.which(cc.compiler[0]):
    print("SKIP no unix C compiler")
    raise SystemExit
setup = runpy.run_path({setup!r}, run_name="gdnconv_setup")
try:
    print("FLAGS", setup["openmp_flags"](cc, setup["OPT_FLAGS"]))
except RuntimeError as e:
    print("ERROR", e)
"""

pytestmark = pytest.mark.skipif(not os.path.exists(SETUP), reason="needs the source tree's setup.py")


def _probe(**env):
    r = run_python(PROBE.format(setup=SETUP), **env)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    if line.startswith("SKIP"):
        pytest.skip(line)
    return line


def _sanitizers_link():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "t.c")
        with open(src, "w") as f:
            f.write("int main(void) { return 0; }\n")
        r = subprocess.run([cc, "-fsanitize=address,undefined", src, "-o", os.path.join(tmp, "t")],
                           capture_output=True)
    return r.returncode == 0


def test_probe_honours_sanitizer_flags():
    """CFLAGS/LDFLAGS with -fsanitize: the probe links with them, as the extension does
    (it linked without them, failed, and the build silently lost its threads)."""
    if not _sanitizers_link():
        pytest.skip("the C compiler cannot link -fsanitize=address,undefined here")
    flags = "-fsanitize=address,undefined"
    assert _probe(CFLAGS=flags, LDFLAGS=flags) == "FLAGS ['-fopenmp']"


def test_probe_fails_loudly_when_openmp_does_not_link():
    line = _probe(LDFLAGS="-lgdnconv_no_such_library")
    assert line.startswith("ERROR"), line
    for words in ("OpenMP does not work", "-lgdnconv_no_such_library", "GDNCONV_NO_OPENMP=1"):
        assert words in line, line


def test_no_openmp_is_the_explicit_opt_out():
    assert _probe(LDFLAGS="-lgdnconv_no_such_library", GDNCONV_NO_OPENMP="1") == "FLAGS []"


SIDE_BY_SIDE = """
import os, runpy, shutil, sys, tempfile
import setuptools
from distutils.ccompiler import new_compiler
from distutils.errors import CompileError
from distutils.sysconfig import customize_compiler
cc = new_compiler()
customize_compiler(cc)
if cc.compiler_type != "unix" or not shutil.which(cc.compiler[0]):
    print("SKIP no unix C compiler")
    raise SystemExit
setup = runpy.run_path({setup!r}, run_name="gdnconv_setup")
setup["compile_side_by_side"](cc, 2)
with tempfile.TemporaryDirectory() as tmp:
    srcs = []
    for name, body in (("a", "int a(void) {{ return 1; }}"), ("b", "int b(void) {{ return 2; }}"),
                       ("bad", "int bad(void) {{ return }}"), ("c", "int c(void) {{ return 3; }}")):
        srcs.append(os.path.join(tmp, name + ".c"))
        with open(srcs[-1], "w") as f:
            f.write(body + "\\n")
    good = [s for s in srcs if "bad" not in s]
    objs = cc.compile(good, output_dir=tmp)
    print("BUILT", sorted(os.path.basename(o) for o in objs if os.path.getsize(o) > 0))
    try:
        cc.compile(srcs, output_dir=os.path.join(tmp, "second"))
        print("NO ERROR")
    except CompileError as e:
        print("ERROR", type(e).__name__)
"""


def test_sources_compile_side_by_side_and_a_failure_stops_the_build():
    """setup.py compiles the extension's sources side by side (compile_side_by_side): every
    object is built, and a source that does not compile fails the build with distutils'
    CompileError, as one after another (the compiler's message names the file)."""
    r = run_python(SIDE_BY_SIDE.format(setup=SETUP))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    if lines[-1].startswith("SKIP"):
        pytest.skip(lines[-1])
    assert "BUILT ['a.o', 'b.o', 'c.o']" in lines, r.stdout
    assert lines[-1] == "ERROR CompileError", r.stdout


def test_build_jobs_from_the_option_the_environment_or_the_cpus(monkeypatch):
    """build_jobs: build_ext -j N first, then GDNCONV_BUILD_JOBS, then the CPUs; a
    GDNCONV_BUILD_JOBS that is not a positive integer is refused, naming the variable."""
    import runpy
    jobs = runpy.run_path(SETUP, run_name="gdnconv_setup")["build_jobs"]
    monkeypatch.setenv("GDNCONV_BUILD_JOBS", "3")
    assert jobs(5) == 5
    assert jobs(None) == 3
    monkeypatch.delenv("GDNCONV_BUILD_JOBS")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert jobs(None) == cpus
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("GDNCONV_BUILD_JOBS", bad)
        with pytest.raises(ValueError, match=f"GDNCONV_BUILD_JOBS='{bad}' is not a positive integer"):
            jobs(None)

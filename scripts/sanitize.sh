#!/usr/bin/env bash
# Builds gdnconv with AddressSanitizer + UndefinedBehaviorSanitizer (OpenMP kept, GCC or
# clang) into build/sanitize/ (the in-place build is left alone) and runs the test suite
# on it, with every sanitizer report fatal.
#
#   scripts/sanitize.sh            the whole suite once, the best ISA as the default:
#                                  every test on the `isa` fixture runs each ISA this CPU
#                                  has, the fuzzer picks one per call, and the exit test
#                                  runs each in its own interpreter
#   scripts/sanitize.sh --all      and then the whole suite again under GDNCONV_ISA=<name>
#                                  for every other ISA this CPU has (each test on its
#                                  default ISA too)
#   scripts/sanitize.sh --subset   only the tests that hunt memory faults (prefill, safety,
#                                  errors, fuzz) on the best ISA: the shorter run
#   scripts/sanitize.sh -- ARGS    extra pytest arguments (e.g. -- -k fuzz -x)
#   GDNCONV_FUZZ_CALLS=N ...       a longer fuzz run inside the suite
#
# The interpreter is not instrumented, so the ASan runtime is preloaded (LD_PRELOAD) and
# leak detection is off (CPython keeps objects alive at exit). libstdc++ is preloaded
# after it: ASan intercepts __cxa_throw only in a C++ runtime loaded at start-up, and
# without it any C++ exception torch throws (loaded later) aborts the run. Subprocess
# tests inherit the environment and run sanitized too.
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
tests=(tests)
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --all) all=1 ;;
        --subset) tests=(tests/test_prefill.py tests/test_safety.py tests/test_errors.py tests/test_fuzz.py) ;;
        --) shift; pytest_args=("$@"); break ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "sanitize.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

out=build/sanitize
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
rm -rf "$out"
mkdir -p "$out/lib"
start=$(date +%s)
echo "== building with $flags -O1"
CFLAGS="$flags" LDFLAGS="$flags" GDNCONV_OPT_FLAGS="-O1 -fno-math-errno -fno-trapping-math -Wno-unused-function" \
    python setup.py build_ext -j "$(nproc)" -b "$out/lib" -t "$out/tmp" > "$out/build.log" 2>&1 \
    || { tail -n 40 "$out/build.log"; exit 1; }
cp src/gdnconv/*.py "$out/lib/gdnconv/"
ldd "$out"/lib/gdnconv/_core*.so | grep -E 'libgomp|libomp' > /dev/null \
    || { echo "sanitize.sh: the sanitized build has no OpenMP runtime" >&2; exit 1; }

cc=${CC:-cc}
asan=$($cc -print-file-name=libasan.so)
case "$asan" in /*) ;; *) asan=$($cc -print-file-name=libclang_rt.asan-x86_64.so) ;; esac
stdcxx=$($cc -print-file-name=libstdc++.so.6)
export LD_PRELOAD="$asan $stdcxx${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONPATH="$PWD/$out/lib"
echo "== build: $(( $(date +%s) - start )) s; LD_PRELOAD=$LD_PRELOAD"

isas=$(python -c "import gdnconv; print(' '.join(gdnconv.available_isas()))")
best=${isas%% *}
runs=("$best")
if [ $all = 1 ]; then
    for isa in $isas; do [ "$isa" = "$best" ] || runs+=("$isa"); done
fi
status=0
for isa in "${runs[@]}"; do
    t=$(date +%s)
    echo "== tests, GDNCONV_ISA=$isa (this CPU: $isas)"
    GDNCONV_ISA=$isa python -m pytest -q -p no:cacheprovider "${tests[@]}" "${pytest_args[@]}" || status=1
    echo "== GDNCONV_ISA=$isa: $(( $(date +%s) - t )) s"
done
echo "== total $(( $(date +%s) - start )) s, $( [ $status = 0 ] && echo passed || echo FAILED )"
exit $status

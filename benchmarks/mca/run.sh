#!/usr/bin/env bash
# Static cycle estimates of the aarch64 hot loops with llvm-mca (benchmarks/README.md,
# "aarch64: static estimate"): cycles per output element, bf16 in and out, W = 4, SiLU,
# fp32 weights, channel-contiguous plain decode, steady state (200 iterations, data in
# L1: no cache misses are modelled). Needs aarch64-linux-gnu-gcc and llvm-mca-19.
# Usage: benchmarks/mca/run.sh [cpu ...]   (default: neoverse-v2 neoverse-n1)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=(aarch64-linux-gnu-gcc -O3 -fno-math-errno -fno-trapping-math -Wno-unused-function
    -I"$repo/include" -I"$repo/src/csrc" -S)
mca=${LLVM_MCA:-llvm-mca-19}
cpus=("$@")
[ ${#cpus[@]} -gt 0 ] || cpus=(neoverse-v2 neoverse-n1)

"${cc[@]}" "$repo/benchmarks/mca/neon_tokens.c" -o "$tmp/neon.s"
"${cc[@]}" -DGDN_MCA_BF16 "$repo/benchmarks/mca/neon_tokens.c" -o "$tmp/bf16.s"
for v in neon bf16; do awk '/LLVM-MCA-BEGIN/{p=1} p{print} /LLVM-MCA-END/{p=0}' "$tmp/$v.s" > "$tmp/$v.r.s"; done
"${cc[@]}" "$repo/benchmarks/mca/portable_row.c" -o "$tmp/port.s"
python3 "$repo/benchmarks/mca/loops.py" "$tmp/port.s" mca_portable "$tmp/pm" > /dev/null
silu=$(grep -o 'bl[[:space:]]*gdn_silu_row[.a-z0-9]*' "$tmp/port.s" | tail -1 | awk '{print $2}')
python3 "$repo/benchmarks/mca/loops.py" "$tmp/port.s" "$silu" "$tmp/ps" > /dev/null

"${cc[@]}" "$repo/benchmarks/mca/pr54093_reconstructed.c" -o "$tmp/pr.s"
awk '/LLVM-MCA-BEGIN/{p=1} p{print} /LLVM-MCA-END/{p=0}' "$tmp/pr.s" > "$tmp/pr.r.s"
# update_simd.h's staging at T = 1, plain mode, per 16 bf16 channels (32 bytes a row): state
# rows in (3), the token (1), state rows out (3), the window shift (3): 20 q loads + 20 q stores
for i in $(seq 0 19); do printf 'ldr q%d, [x0, #%d]\nstr q%d, [x1, #%d]\n' $((i % 8)) $((16 * i)) $((i % 8)) $((16 * i)); done > "$tmp/copy.s"

# cycles per iteration of file $2 on cpu $1 (empty if llvm-mca cannot take it, e.g. BFCVTN on N1)
cyc() { "$mca" -mtriple=aarch64-linux-gnu -mcpu="$1" -iterations=200 "$2" 2>/dev/null \
        | awk '/Total Cycles/{printf "%.2f", $3 / 200}' || true; }
per() { [ -n "$1" ] && awk -v c="$1" -v n="$2" 'BEGIN{printf "%.3f", c / n}' || echo "n/a"; }
printf "%-13s %-44s %10s %10s %14s\n" cpu loop "cyc/iter" "out/iter" "cyc/output"
for cpu in "${cpus[@]}"; do
    c0=$(cyc "$cpu" "$tmp/pm.0.s"); c1=$(cyc "$cpu" "$tmp/ps.0.s"); c2=$(cyc "$cpu" "$tmp/pm.1.s")
    printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "portable: conv (gdn_scalar_conv)" "$c0" 8 "$(per "$c0" 8)"
    printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "portable: SiLU bf16 (gdn_silu_row)" "$c1" 4 "$(per "$c1" 4)"
    printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "portable: round + store" "$c2" 8 "$(per "$c2" 8)"
    tot=$(awk -v a="$c0" -v b="$c1" -v c="$c2" 'BEGIN{printf "%.3f", a / 8 + b / 4 + c / 8}')
    printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "portable: total" "" "" "$tot"
    for v in neon bf16; do
        c=$(cyc "$cpu" "$tmp/$v.r.s")
        name=$([ $v = neon ] && echo "neon: simd_tokens (16 channels, 1 token)" || echo "neonbf16: simd_tokens (BFCVTN stores)")
        printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "$name" "$c" 16 "$(per "$c" 16)"
    done
    c=$(cyc "$cpu" "$tmp/copy.s")
    printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "neon*: staging copies, T=1 plain (add)" "$c" 16 "$(per "$c" 16)"
    c=$(cyc "$cpu" "$tmp/pr.r.s")
    printf "%-13s %-44s %10s %10s %14s\n" "$cpu" "PR 54093 (reconstructed): 8 channels, 1 token" "$c" 8 "$(per "$c" 8)"
done

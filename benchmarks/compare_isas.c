/* Every SIMD row against the portable kernel on a grid, without Python: the update
 * (dtypes, widths 2..8, SiLU or none, plain and speculative mode, fixed and varlen
 * batches with a pad slot, three state layouts, three weight forms, channel counts
 * with and without a tail) and the prefill (with and without initial state, two state
 * layouts), plus every bf16 and fp16 bit pattern through W=2 weights [0, 1] (the
 * pre-activation is x itself, so the conversions and the SiLU see every input). Built
 * and run under qemu by scripts/test_aarch64.sh --quick; natively on x86 it checks
 * the x86 rows the same way:
 *
 *   gcc -O3 -fno-math-errno -fno-trapping-math -fopenmp -Iinclude -Isrc/csrc \
 *       benchmarks/compare_isas.c src/csrc/[a-z]*.c -lm -o /tmp/compare_isas
 *   /tmp/compare_isas [isa ...]      (default: every compiled row this CPU runs)
 *
 * Pass: the states bit for bit the portable kernel's; the pattern sweeps without SiLU
 * bit for bit (conversions only); other outputs within 2 ulp of the output dtype (each
 * kernel's SiLU is within 1 ulp of the correctly rounded result) or within the
 * pre-activation's rounding bound, NaN where it is NaN. Prints per row the cases, the
 * outputs compared, how many are not bit-equal, the largest difference in ulp; exit
 * status 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdnconv/gdnconv.h"

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {   /* xorshift64 */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float uni(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

static int esize(int dt) { return dt == GDN_F32 ? 4 : 2; }

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint16_t to_half(float f) {   /* round to nearest even (finite inputs of moderate size) */
    const uint32_t u = f2u(f), s = (u >> 16) & 0x8000u;
    const float a = fabsf(f);
    if (a < 0x1p-14f) return (uint16_t)(s | (uint32_t)lrintf(a * 0x1p24f));
    const uint32_t v = f2u(a), r = (v + 0xfffu + ((v >> 13) & 1u)) >> 13;
    return (uint16_t)(s | (r - ((127u - 15u) << 10)));
}

/* a value of dtype dt into element i of a */
static void put(void *a, int64_t i, float f, int dt) {
    if (dt == GDN_F32) ((float *)a)[i] = f;
    else if (dt == GDN_BF16) ((uint16_t *)a)[i] = (uint16_t)((f2u(f) + 0x7fffu + ((f2u(f) >> 16) & 1u)) >> 16);
    else ((uint16_t *)a)[i] = to_half(f);
}

static double as_double(const void *a, int64_t i, int dt) {
    if (dt == GDN_F32) return ((const float *)a)[i];
    const uint16_t h = ((const uint16_t *)a)[i];
    if (dt == GDN_BF16) return u2f((uint32_t)h << 16);
    const int ex = (h >> 10) & 31, m = h & 1023;
    const double v = ex == 31 ? (m ? NAN : INFINITY) : ex ? ldexp(1024 + m, ex - 25) : ldexp(m, -24);
    return h >> 15 ? -v : v;
}

/* steps between representable values of dtype dt (+0 and -0 the same) */
static int64_t line(const void *a, int64_t i, int dt) {
    const uint32_t u = dt == GDN_F32 ? ((const uint32_t *)a)[i] : ((const uint16_t *)a)[i];
    const int top = dt == GDN_F32 ? 31 : 15;
    const int64_t mag = u & ((1u << top) - 1u);
    return (u >> top) ? -mag : mag;
}

typedef struct {
    long cases, outs, diff, fail;
    int64_t worst;
} tally;

/* out (n elements) and state (ns bytes) of a row against the portable kernel's: the
 * state bit for bit; out bit for bit where exact (patterns without SiLU: the
 * pre-activation is x), otherwise within 2 ulp of the output dtype plus tol (the
 * pre-activation's rounding: the portable kernel's sums are not fused everywhere, e.g.
 * on x86 without FMA), NaN where it is NaN. */
static void compare(tally *t, const char *what, const void *out, const void *ref, int64_t n, const void *st,
                    const void *rst, int64_t ns, int dt, int exact, double tol) {
    int bad = ns && memcmp(st, rst, (size_t)ns) != 0;
    if (bad) printf("  %s: conv_state differs\n", what);
    for (int64_t i = 0; i < n; i++) {
        const double a = as_double(out, i, dt), b = as_double(ref, i, dt);
        t->outs++;
        if (exact && line(out, i, dt) != line(ref, i, dt)) {   /* raw bits, NaN payloads included */
            if (bad++ < 4) printf("  %s: out[%ld] %.9g, portable %.9g (bits differ)\n", what, (long)i, a, b);
            continue;
        }
        if (isnan(a) || isnan(b)) {
            if (isnan(a) != isnan(b) && bad++ < 4) printf("  %s: out[%ld] %g, portable %g\n", what, (long)i, a, b);
            continue;
        }
        const int64_t d = llabs(line(out, i, dt) - line(ref, i, dt));
        t->diff += d != 0;
        if (d > t->worst) t->worst = d;
        if (d > 2 && fabs(a - b) > tol && bad++ < 4)
            printf("  %s: out[%ld] %.9g, portable %.9g (%ld steps)\n", what, (long)i, a, b, (long)d);
    }
    t->cases++;
    t->fail += bad != 0;
}

static const char *dname(int dt) { return dt == GDN_F32 ? "fp32" : dt == GDN_F16 ? "fp16" : "bf16"; }

/* One update case on row isa: layout 0 (S, L, D), 1 (S, D, L), 2 (S, D, L + 1) seen as [..., 1:];
 * weights 0 packed fp32 (W, D), 1 (D, W) of dt, 2 (D, W) fp32, 3 vLLM's packed layout of dt
 * (is_weight_packed: W = 4 only, D a multiple of 32; bf16 read in place, the others converted). */
static void update_case(tally *t, const char *isa, int dt, int W, int silu, int spec, int varlen, int layout,
                        int wform, int64_t D) {
    if (wform == 3 && W != 4) return;
    const int64_t B = 3, T = 1 + rnd() % 4, S = B + 1, L = spec ? W - 2 + T : W - 1 + (int64_t)(rnd() % 2);
    int32_t slots[3] = {2, -1, 0}, nat[3], qsl[4] = {0, 0, 0, 0};
    for (int i = 0; i < 3; i++) nat[i] = 1 + (int)(rnd() % (T < 2 ? 1 : T));   /* 1..T, spec */
    for (int i = 0; i < 3; i++) qsl[i + 1] = qsl[i] + (int32_t)(varlen ? rnd() % (T + 1) : T);
    const int64_t N = qsl[3], cap = B * T * D, cols = L + (layout == 2), e = esize(dt);
    const int wdt = wform == 1 || wform == 3 ? dt : GDN_F32;
    char *x = malloc(cap * e), *out = malloc(cap * e), *ref = malloc(cap * e);
    char *st = malloc(S * cols * D * e), *st0 = malloc(S * cols * D * e), *rst = malloc(S * cols * D * e);
    void *w = malloc(W * D * 4), *b = malloc(D * 4);
    for (int64_t i = 0; i < cap; i++) put(x, i, 2 * uni(), dt);
    for (int64_t i = 0; i < S * cols * D; i++) put(st0, i, 2 * uni(), dt);
    for (int64_t i = 0; i < W * D; i++) put(w, i, uni(), wdt);
    for (int64_t i = 0; i < D; i++) put(b, i, 0.5f * uni(), wdt);
    gdn_update_params p;
    memset(&p, 0, sizeof p);
    p.batch = B, p.dim = D, p.width = W, p.state_len = L, p.num_slots = S, p.seqlen = T, p.pad_slot_id = -1;
    p.dtype = dt, p.weight_dtype = wdt, p.silu = silu, p.skipped_rows = GDN_SKIPPED_ZERO;
    p.x = x, p.x_stride_b = varlen ? 0 : T * D, p.x_stride_t = D, p.x_stride_d = 1;   /* varlen: [N, D] */
    p.out = out, p.out_stride_b = p.x_stride_b, p.out_stride_t = D, p.out_stride_d = 1;
    if (layout == 0) p.state_stride_s = L * D, p.state_stride_l = D, p.state_stride_d = 1;
    else p.state_stride_s = cols * D, p.state_stride_l = 1, p.state_stride_d = cols;
    p.weight = w;
    if (wform == 0) p.weight_stride_d = 1, p.weight_stride_w = D;
    else p.weight_stride_d = W, p.weight_stride_w = 1;
    p.is_weight_packed = wform == 3;   /* (any values at the packed places are some weight's) */
    p.bias = rnd() % 4 ? b : NULL, p.bias_stride = 1;
    p.conv_state_indices = slots, p.num_accepted_tokens = spec ? nat : NULL, p.query_start_loc = varlen ? qsl : NULL;
    int64_t bi, bv;
    if (gdn_update_validate(&p, varlen ? N : B * T, &bi, &bv) != GDN_OK) {
        printf("  invalid case (%ld %ld)\n", (long)bi, (long)bv);
        t->fail++;
        return;
    }
    char *outs[2] = {ref, out}, *sts[2] = {rst, st};
    const char *rows[2] = {"scalar", isa};
    for (int r = 0; r < 2; r++) {
        memcpy(sts[r], st0, S * cols * D * e);
        memset(outs[r], 0x5a, cap * e);
        p.conv_state = sts[r] + (layout == 2) * e, p.out = outs[r];
        gdn_select_isa(rows[r]);
        gdn_update_run(&p, 1 + (int)(rnd() % 2));
    }
    char what[160];
    snprintf(what, sizeof what, "%s update %s W=%d %s %s %s layout=%d weights=%d D=%ld T=%ld", isa, dname(dt), W,
             silu ? "silu" : "none", spec ? "spec" : "plain", varlen ? "varlen" : "fixed", layout, wform, (long)D,
             (long)T);
    compare(t, what, out, ref, cap, st, rst, S * cols * D * e, dt, 0, 8 * W * (2 * W + 1) * 0x1p-24);
    free(x), free(out), free(ref), free(st), free(st0), free(rst), free(w), free(b);
}

/* One prefill case: varlen requests of 0..40 tokens, initial state on some, layout 0 or 1. */
static void prefill_case(tally *t, const char *isa, int dt, int W, int silu, int layout, int64_t D) {
    const int64_t B = 3, S = 4, L = W - 1, e = esize(dt);
    int32_t qsl[4] = {0}, slots[3] = {3, 0, 1};
    uint8_t init[3] = {1, 0, 1};
    for (int i = 0; i < 3; i++) qsl[i + 1] = qsl[i] + (int32_t)(rnd() % 41);
    const int64_t N = qsl[3] ? qsl[3] : 1;
    char *x = malloc(N * D * e), *out = malloc(N * D * e), *ref = malloc(N * D * e);
    char *st = malloc(S * L * D * e), *st0 = malloc(S * L * D * e), *rst = malloc(S * L * D * e);
    float *w = malloc(W * D * 4), *b = malloc(D * 4);
    for (int64_t i = 0; i < N * D; i++) put(x, i, 2 * uni(), dt);
    for (int64_t i = 0; i < S * L * D; i++) put(st0, i, 2 * uni(), dt);
    for (int64_t i = 0; i < W * D; i++) w[i] = uni();
    for (int64_t i = 0; i < D; i++) b[i] = 0.5f * uni();
    gdn_prefill_params pp;
    memset(&pp, 0, sizeof pp);
    gdn_update_params *p = &pp.conv;
    p->batch = B, p->dim = D, p->width = W, p->state_len = L, p->num_slots = S, p->pad_slot_id = -1;
    p->dtype = dt, p->weight_dtype = GDN_F32, p->silu = silu;
    p->x = x, p->x_stride_b = 0, p->x_stride_t = D, p->x_stride_d = 1;
    p->out_stride_b = 0, p->out_stride_t = D, p->out_stride_d = 1;
    if (layout == 0) p->state_stride_s = L * D, p->state_stride_l = D, p->state_stride_d = 1;
    else p->state_stride_s = L * D, p->state_stride_l = 1, p->state_stride_d = L;
    p->weight = w, p->weight_stride_d = 1, p->weight_stride_w = D, p->bias = b, p->bias_stride = 1;
    p->conv_state_indices = slots, p->query_start_loc = qsl, pp.has_initial_state = init;
    int64_t bi, bv;
    if (gdn_prefill_validate(&pp, qsl[3], &bi, &bv) != GDN_OK) {
        printf("  invalid prefill case (%ld %ld)\n", (long)bi, (long)bv);
        t->fail++;
        return;
    }
    char *outs[2] = {ref, out}, *sts[2] = {rst, st};
    const char *rows[2] = {"scalar", isa};
    for (int r = 0; r < 2; r++) {
        memcpy(sts[r], st0, S * L * D * e);
        memset(outs[r], 0x5a, N * D * e);
        p->conv_state = sts[r], p->out = outs[r];
        gdn_select_isa(rows[r]);
        gdn_prefill_run(&pp, 1 + (int)(rnd() % 2));
    }
    char what[160];
    snprintf(what, sizeof what, "%s prefill %s W=%d %s layout=%d D=%ld N=%ld", isa, dname(dt), W,
             silu ? "silu" : "none", layout, (long)D, (long)qsl[3]);
    compare(t, what, out, ref, qsl[3] * D, st, rst, S * L * D * e, dt, 0, 8 * W * (2 * W + 1) * 0x1p-24);
    free(x), free(out), free(ref), free(st), free(st0), free(rst), free(w), free(b);
}

/* Every 16-bit pattern of dtype dt as x through W=2 weights [0, 1] (the pre-activation
 * is x, in any order of operations), non-finite ones only in the last token (a window
 * row times weight 0 would make a NaN); weights fp32 or dt. */
static void patterns_case(tally *t, const char *isa, int dt, int silu, int wdt) {
    const int64_t D = 8192 + 13, T = 9, n = D * T;
    uint16_t *x = malloc(n * 2), *out = malloc(n * 2), *ref = malloc(n * 2), *st = calloc(D, 2);
    void *w = malloc(D * 2 * 4);
    int64_t fin = 0, inf = (T - 1) * D;
    for (uint32_t v = 0; v < 65536; v++) {
        const uint16_t h = (uint16_t)v;
        const int nonfinite = dt == GDN_BF16 ? (h & 0x7f80) == 0x7f80 : (h & 0x7c00) == 0x7c00;
        x[nonfinite ? inf++ : fin++] = h;
    }
    while (fin < (T - 1) * D) x[fin++] = 0;
    while (inf < n) x[inf++] = 0;
    for (int64_t c = 0; c < D; c++) put(w, 2 * c, 0.0f, wdt), put(w, 2 * c + 1, 1.0f, wdt);
    int32_t slot = 0;
    gdn_update_params p;
    memset(&p, 0, sizeof p);
    p.batch = 1, p.dim = D, p.width = 2, p.state_len = 1, p.num_slots = 1, p.seqlen = T, p.pad_slot_id = -1;
    p.dtype = dt, p.weight_dtype = wdt, p.silu = silu;
    p.x = x, p.x_stride_b = n, p.x_stride_t = D, p.x_stride_d = 1;
    p.out_stride_b = n, p.out_stride_t = D, p.out_stride_d = 1;
    p.state_stride_s = D, p.state_stride_l = D, p.state_stride_d = 1;
    p.weight = w, p.weight_stride_d = 2, p.weight_stride_w = 1, p.conv_state_indices = &slot;
    uint16_t *outs[2] = {ref, out};
    const char *rows[2] = {"scalar", isa};
    for (int r = 0; r < 2; r++) {
        memset(st, 0, D * 2);
        p.out = outs[r], p.conv_state = st;
        gdn_select_isa(rows[r]);
        gdn_update_run(&p, 1);
    }
    char what[96];
    snprintf(what, sizeof what, "%s all %s patterns, %s, weights %s", isa, dname(dt), silu ? "silu" : "none",
             dname(wdt));
    compare(t, what, out, ref, n, NULL, NULL, 0, dt, !silu, 0.0);
    free(x), free(out), free(ref), free(st), free(w);
}

int main(int argc, char **argv) {
    const char *isas[16];
    int nisa = 0;
    for (int i = 1; i < argc && nisa < 16; i++) isas[nisa++] = argv[i];
    if (!nisa)
        for (int i = 0; i < gdn_isa_count() && nisa < 16; i++)
            if (gdn_isa_supported(i) && strcmp(gdn_isa_name(i), "scalar") != 0) isas[nisa++] = gdn_isa_name(i);
    static const int dts[] = {GDN_F32, GDN_F16, GDN_BF16};
    static const int64_t dims[] = {19, 300, 1000};
    int fail = 0;
    for (int k = 0; k < nisa; k++) {
        if (gdn_select_isa(isas[k]) != 0) {
            printf("%-10s not compiled or not supported here\n", isas[k]);
            fail = 1;
            continue;
        }
        tally t = {0};
        for (int d = 0; d < 3; d++)
            for (int W = 2; W <= 8; W++)
                for (int silu = 0; silu < 2; silu++)
                    for (int mode = 0; mode < 3; mode++)   /* plain fixed, spec fixed, spec varlen */
                        for (int layout = 0; layout < 3; layout++)
                            for (int wf = 0; wf < 4; wf++)
                                update_case(&t, isas[k], dts[d], W, silu, mode > 0, mode == 2, layout, wf,
                                            wf == 3 ? 288 : dims[(W + layout + wf) % 3]);
        for (int d = 0; d < 3; d++)
            for (int W = 2; W <= 8; W++)
                for (int silu = 0; silu < 2; silu++)
                    for (int layout = 0; layout < 2; layout++) prefill_case(&t, isas[k], dts[d], W, silu, layout,
                                                                            dims[(W + layout) % 3]);
        for (int silu = 0; silu < 2; silu++) {
            patterns_case(&t, isas[k], GDN_BF16, silu, GDN_BF16);
            patterns_case(&t, isas[k], GDN_BF16, silu, GDN_F32);
            patterns_case(&t, isas[k], GDN_F16, silu, GDN_F16);
        }
        printf("%-10s %ld cases, %ld outputs, %ld not bit-equal to the portable kernel's, largest difference "
               "%ld steps; %ld cases failed\n", isas[k], t.cases, t.outs, t.diff, (long)t.worst, t.fail);
        fail |= t.fail != 0;
    }
    gdn_select_isa(NULL);
    return fail;
}

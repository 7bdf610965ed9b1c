/* The update's SIMD loop structure shared by the ISA kernels; included by
 * update_<isa>.c after its simd_<isa>.h, which defines for its vector width:
 *   V, R              fp32 vector and raw-bits vector (16-bit lanes in the low half)
 *   LANES             channels per vector
 *   ld_raw, st_raw    load / store LANES raw elements of dtype dt
 *   to_f32, from_f32  raw <-> fp32 (rounding to nearest even)
 *   vload, vstore, vfma
 *   vsilu_n(y, n, dt)     silu of n vectors in place, each step across all n
 *   gather_taps(v, W, k)  tap k of LANES channels from W vectors holding [LANES, W]
 *   taps_block(src, wdt, W, t)  optional: the same for all W taps of a block at src,
 *                         where SIMD_TAPS_BLOCK(wdt, W) says it takes the dtype and width
 *   wpair(src, lo, hi)    LANES 32-bit lanes of bf16 pairs as fp32, low halves to *lo,
 *                         high halves to *hi (vLLM's packed weight: gdnconv.h)
 *   st2_native(p, lo, hi)   optional (SIMD_ST2_NATIVE): store two vectors of dtype
 *                           GDN_BF16_NATIVE, lo then hi, exactly as two st_raw(from_f32)
 *   GDN_SIMD_OPAQUE(v)      an empty asm statement that keeps v in a register
 *   TC_LINE, tc_plan, tc_plan_in/out, tc_in/out, tc_out_ok: the transposition of a
 *                           time-contiguous state (see state_in / state_out)
 *   TC_ROLL, tc_roll_plan, tc_plan_roll, tc_roll_line: optional, the speculative roll
 *                           of a time-contiguous state in place (see tc_roll)
 *   SIMD_SD_DIRECT          optional: decode of up to 4 tokens of a channel-contiguous
 *                           state in place (sd_direct), where the registers hold its rows
 * and then defines its kernels as calls of simd_kernel() and simd_fill().
 * Vectors of 128 bits or more (LANES >= 4 fp32 lanes): a line step takes up to four
 * vectors, one 64-byte line of x86 vectors or 16 channels of 128-bit ones.
 * Channels past the last whole line step of a block go to the shared scalar core. */
#ifndef LANES
#error "update_simd.h: include an ISA's simd_<isa>.h first"
#endif
#if LANES < 4 || GDN_BLOCK_CHANNELS % (4 * LANES) != 0 || GDN_BLOCK_CHANNELS_MAX % GDN_BLOCK_CHANNELS != 0
#error "update_simd.h needs LANES >= 4 and blocks of whole line steps"
#endif
#ifndef GDN_SIMD_OPAQUE
#error "update_simd.h: the ISA header must define GDN_SIMD_OPAQUE"
#endif

#include "simd_tokens.h"

/* A/B switches of the cold-call measures (benchmarks/README.md): prefetch of the next
 * unit (GDN_PF_AHEAD 0: none), one line in GDN_PF_EVERY bytes of each row. */
#ifndef GDN_PF_AHEAD
#define GDN_PF_AHEAD 1
#endif
#ifndef GDN_PF_EVERY
#define GDN_PF_EVERY 64
#endif

/* bytes (a multiple of 64) from src to dst, raw, in ascending order (so dst < src
 * may overlap). The empty asm keeps the compiler from turning the loop into a
 * memcpy call (~14 calls of 512 bytes per request and block, where the profile
 * put 14% of the time at B=1; inline copies measured ~2% faster). */
GDN_INLINE void simd_copy(char *dst, const char *src, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += LANES * 4) {
        R v = ld_raw(src + o, GDN_F32);
        GDN_SIMD_OPAQUE(v);
        st_raw(dst + o, v, GDN_F32);
    }
}

/* ---- time-contiguous conv_state ----
 * conv_state[s, l, d] at l + d * sd (time stride 1, channel stride sd >= L): vLLM's
 * DS layout (S, D, L) passed transposed (sd = L), transformers' (B, D, W) cache as
 * [..., 1:] (sd = W), or padded. simd_unit moves state rows through its staging
 * buffer either way (state_in / state_out below): a channel-contiguous state row by
 * row, a time-contiguous one transposed on the way, so the outputs and the state are
 * those of the channel-contiguous call, bit for bit (the speculative roll of a
 * time-contiguous state goes in place where the ISA has tc_roll_line: see tc_roll).
 * The ISA header provides, for
 * sd <= GDN_TC_MAX_SD, the register transposition of one 64-byte line of channels
 * (TC_LINE(e) channels of e-byte elements, a tc_plan built once per call of
 * tc_load / tc_save):
 *   tc_plan_in(t, sd, R, e)   tc_in(dst, bs, src, sd, R, t, e): dst row k (dst + k*bs)
 *                             <- src elements j*sd + k, k < R; reads src[0, TC_LINE*sd)
 *   tc_plan_out(t, sd, R, e)  tc_out(dst, sd, R, src, bs, t, e): the inverse, writing
 *                             only elements j*sd + k, k < R; tc_out_ok(sd, R, e) says
 *                             whether it can (element loops otherwise). */
#define GDN_TC_MAX_SD GDN_MAX_WIDTH

/* A switch on (sd, e) that runs F(SD, E) with both as constants, for 2 <= sd <= GDN_TC_MAX_SD. */
#define TC_CASES(F, E)                                                                 \
    case 2 * 8 + E: F(2, E); break;                                                    \
    case 3 * 8 + E: F(3, E); break;                                                    \
    case 4 * 8 + E: F(4, E); break;                                                    \
    case 5 * 8 + E: F(5, E); break;                                                    \
    case 6 * 8 + E: F(6, E); break;                                                    \
    case 7 * 8 + E: F(7, E); break;                                                    \
    case 8 * 8 + E: F(8, E); break;
#define TC_SWITCH(sd, e, F) switch ((sd) * 8 + (e)) { TC_CASES(F, 2) TC_CASES(F, 4) default: break; }

/* Rows [0, R) of channels [0, n) from st (element (k, c) at k + c*sd) to tmp rows bs
 * bytes apart. room: channels from st's to the array's last, inclusive; a line is read
 * whole only when a channel follows it, so no read passes the array's last element. */
static GDN_NOINLINE void tc_load(char *tmp, int64_t bs, const char *st, int64_t sd, int R, int64_t n, int64_t room,
                        const int dt) {
    const int e = gdn_elsize(dt), line = TC_LINE(e);
    int64_t c = 0;
    if (sd <= GDN_TC_MAX_SD) {
        const int64_t nl = (n < room - 1 ? n : room - 1) / line * line;   /* whole lines read */
        tc_plan t;
        tc_plan_in(&t, (int)sd, R, e);
#define TC_IN(SD, E) for (; c < nl; c += line) tc_in(tmp + E * c, bs, st + E * c * SD, SD, R, &t, E)
        TC_SWITCH(sd, e, TC_IN)
#undef TC_IN
    }
    for (; c < n; c++)
        for (int k = 0; k < R; k++) gdn_store_raw(tmp + k * bs, c, gdn_load_raw(st, c * sd + k, dt), dt);
}

/* The inverse: tmp rows [0, R) of channels [0, n) to st; writes nothing else. */
static GDN_NOINLINE void tc_save(char *st, int64_t sd, int R, const char *tmp, int64_t bs, int64_t n, const int dt) {
    const int e = gdn_elsize(dt), line = TC_LINE(e);
    int64_t c = 0;
    if (sd <= GDN_TC_MAX_SD && tc_out_ok((int)sd, R, e)) {
        const int64_t nl = n / line * line;
        tc_plan t;
        tc_plan_out(&t, (int)sd, R, e);
#define TC_OUT(SD, E) for (; c < nl; c += line) tc_out(st + E * c * SD, SD, R, tmp + E * c, bs, &t, E)
        TC_SWITCH(sd, e, TC_OUT)
#undef TC_OUT
    }
    for (; c < n; c++)
        for (int k = 0; k < R; k++) gdn_store_raw(st, c * sd + k, gdn_load_raw(tmp + k * bs, c, dt), dt);
}

#ifdef TC_ROLL
/* The speculative roll of a time-contiguous state, in place: of channels [0, n) at st,
 * rows k < k0 <- old rows k + shift, rows k0 + t <- tok row t (rows bs apart, t < nt);
 * reads old rows before it writes them; writes nothing else. Each channel's rows are
 * contiguous, so the old rows move by a load at an offset, and only the token rows
 * are transposed (state_out would transpose all k0 + nt rows from the staged window).
 * The ISA header's tc_roll_line does a line; AVX2 (no 16-bit masked load or store)
 * keeps state_out. */
static GDN_NOINLINE void tc_roll(char *st, int64_t sd, int64_t shift, int k0, const char *tok, int64_t bs, int nt,
                                 int64_t n, const int dt) {
    const int e = gdn_elsize(dt), line = TC_LINE(e);
    int64_t c = 0;
    if (sd <= GDN_TC_MAX_SD) {
        const int64_t nl = n / line * line;
        tc_roll_plan t;
        tc_plan_roll(&t, (int)sd, k0, nt, e);
#define TC_ROLL_LINES(SD, E) for (; c < nl; c += line) tc_roll_line(st + E * c * SD, SD, shift, tok + E * c, bs, nt, &t, E)
        TC_SWITCH(sd, e, TC_ROLL_LINES)
#undef TC_ROLL_LINES
    }
    for (; c < n; c++) {
        for (int k = 0; k < k0; k++) gdn_store_raw(st, c * sd + k, gdn_load_raw(st, c * sd + k + shift, dt), dt);
        for (int k = 0; k < nt; k++) gdn_store_raw(st, c * sd + k0 + k, gdn_load_raw(tok + k * bs, c, dt), dt);
    }
}
#endif

/* State rows [0, R) at st (rows sl bytes apart, channels sd elements apart) of the
 * unit's n channels (whole line steps) to buf rows bs bytes apart, and back. room:
 * as tc_load's. */
GDN_INLINE void state_in(char *buf, int64_t bs, const char *st, int64_t sl, int64_t sd, int R, int64_t n,
                         int64_t room, const int dt) {
    if (sd == 1)
        for (int k = 0; k < R; k++) simd_copy(buf + k * bs, st + k * sl, n * gdn_elsize(dt));
    else
        tc_load(buf, bs, st, sd, R, n, room, dt);
}

GDN_INLINE void state_out(char *st, int64_t sl, int64_t sd, int R, const char *buf, int64_t bs, int64_t n,
                          const int dt) {
    if (sd == 1)
        for (int k = 0; k < R; k++) simd_copy(st + k * sl, buf + k * bs, n * gdn_elsize(dt));
    else
        tc_save(st, sd, R, buf, bs, n, dt);
}

/* The rows of the unit after request i's block at c0 (in update.c's order, one request
 * a unit), which simd_unit prefetches a line per row per
 * line step, so that a cold call has the next unit's lines in flight while it
 * computes this one: x and out rows of its first slab, and of a channel-contiguous
 * state the rows it reads and those the speculative roll writes, of a time-contiguous
 * one its whole block (as consecutive rows of the block's width). At most: T <= GDN_SLAB
 * x rows, W - 1 window rows (channel-contiguous) or up to GDN_MAX_WIDTH + 1 block rows, T
 * out rows and up to W - 2 + T roll rows outside the window (channel-contiguous,
 * speculative): 3 * GDN_SLAB + 2 * GDN_MAX_WIDTH - 3. (The array held 2 * (GDN_SLAB +
 * GDN_MAX_WIDTH) until stop 57: speculative requests at W >= 6 with T >= 8 and the window
 * far down the state wrote past it.) */
#define GDN_PF_ROWS (3 * GDN_SLAB + 2 * GDN_MAX_WIDTH - 1)
typedef struct {
    const char *row[GDN_PF_ROWS];
    int nr, nw;   /* rows 0..nr-1 are read, nr..nr+nw-1 only written */
} simd_next;

GDN_INLINE void simd_next_rows(const gdn_update_params *p, int64_t i, int64_t c0, simd_next *nx) {
    nx->nr = nx->nw = 0;
#if GDN_PF_AHEAD > 0
    /* the next unit in update.c's order (unit_of): the next block of this request's
     * range of blocks, or the range's first block of the next request */
    const int64_t bc = p->block_channels, blocks = (p->dim + bc - 1) / bc, b = c0 / bc;
    int64_t g0 = 0, g1 = blocks;
    if (p->channel_groups > 1) {   /* (no division per unit otherwise) */
        const int64_t per = (blocks + p->channel_groups - 1) / p->channel_groups;
        g0 = b / per * per, g1 = g0 + per < blocks ? g0 + per : blocks;
    }
    const int64_t ni = b + 1 < g1 ? i : i + 1, nb = b + 1 < g1 ? b + 1 : g0;
    if (ni >= p->batch) return;
    const gdn_request r = gdn_get_request(p, ni);
    if (r.skip) return;
    const int64_t e = gdn_elsize(p->dtype), c = nb * bc;
    const int64_t sd = p->state_stride_d, sl = p->state_stride_l * e;
    const int H = p->width - 1, nt = r.T < GDN_SLAB ? (int)r.T : GDN_SLAB;
    int n = 0;
    for (int j = 0; j < nt; j++) nx->row[n++] = r.x + e * (c + j * p->x_stride_t);
    if (sd == 1) {
        for (int k = 0; k < H; k++) nx->row[n++] = r.state + e * c + (r.off + k) * sl;
    } else {   /* the block's sd * bc elements as sd rows of bc */
        for (int k = 0; k < sd && k < GDN_MAX_WIDTH + 1; k++) nx->row[n++] = r.state + e * (c * sd + k * bc);
    }
    nx->nr = n;
    for (int j = 0; j < nt; j++) nx->row[n++] = r.out + e * (c + j * p->out_stride_t);
    if (sd == 1 && p->num_accepted_tokens)   /* the roll's rows outside the window */
        for (int k = 0; k < p->width - 2 + nt; k++)
            if (k < r.off || k >= r.off + H) nx->row[n++] = r.state + e * c + k * sl;
    nx->nw = n - nx->nr;
#else
    (void)p, (void)i, (void)c0;
#endif
}

/* line (byte offset) o of every row of nx (SIMD_PREFETCH_R / _W: the ISA header's). NR,
 * NW: the caller's expectation of nx's counts of rows read and only written, constants
 * (0: none); a count that matches is prefetched unrolled, without the loop over a count
 * read from memory (benchmarks/README.md, stop 57: warm plain decode 3-8% faster). */
GDN_INLINE void simd_prefetch(const simd_next *nx, int64_t o, const int NR, const int NW) {
    if (NR > 0 && nx->nr == NR) {
#pragma GCC unroll 16
        for (int k = 0; k < NR; k++) SIMD_PREFETCH_R(nx->row[k] + o);
    } else {
        for (int k = 0; k < nx->nr; k++) SIMD_PREFETCH_R(nx->row[k] + o);
    }
    if (NW > 0 && nx->nw == NW) {
#pragma GCC unroll 16
        for (int k = nx->nr; k < nx->nr + NW; k++) SIMD_PREFETCH_W(nx->row[k] + o);
    } else {
        for (int k = nx->nr; k < nx->nr + nx->nw; k++) SIMD_PREFETCH_W(nx->row[k] + o);
    }
}

/* The prefetch of a line step of the given bytes at byte offset o0 of the unit's rows: a
 * line of each of nx's rows per GDN_PF_EVERY bytes. */
GDN_INLINE void simd_prefetch_step(const simd_next *nx, int64_t o0, int64_t bytes, const int NR, const int NW) {
    for (int64_t o = o0; o < o0 + bytes; o += 64)
        if (o % GDN_PF_EVERY == 0) simd_prefetch(nx, o, NR, NW);
}

/* A unit's weights as the line steps read them, channel 0 the unit's first: W fp32 tap
 * rows (row[k][c]), or, where the kernel is instantiated with WP = 1, vLLM's packed bf16
 * weight (W = 4; gdnconv.h), whose 32-bit lanes hold two taps each, so a tap costs half
 * the bytes of a fp32 row and one integer operation (wpair); and the fp32 bias. */
typedef struct {
    const float *row[GDN_MAX_WIDTH];
    const uint16_t *packed;
    const float *bias;
} simd_weights;

/* The 4 taps of the LANES channels at c (c % LANES == 0) of vLLM's packed bf16 weight wp
 * as fp32: the tap pairs (0, 1) and (2, 3), one load each. */
GDN_INLINE void simd_packed_taps(const uint16_t *wp, int64_t c, V *t) {
    wpair(wp + gdn_packed_index(c, 0), &t[0], &t[1]);
    wpair(wp + gdn_packed_index(c, 2), &t[2], &t[3]);
}

/* Taps of the LANES channels at c into w[k][v], and their bias into b[v]. */
GDN_INLINE void simd_taps(const simd_weights *wt, int64_t c, V w[][4], V *b, const int v, const int W,
                          const int WP) {
    b[v] = vload(wt->bias + c);
    if (WP) {   /* (W = 4) */
        V t[4];
        simd_packed_taps(wt->packed, c, t);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) w[k][v] = t[k];
    } else {
#pragma GCC unroll 8
        for (int k = 0; k < W; k++) w[k][v] = vload(wt->row[k] + c);
    }
}

/* The nt tokens of one line step (rows xt bytes apart at xs, outputs ot apart at os) in
 * groups of 4 / NV vectors' worth, the remainder in halving groups. */
GDN_INLINE void simd_token_groups(const char *xs, int64_t xt, char *os, int64_t ot, int64_t nt, V w[][4],
                                  const V *b, V hf[][4], const int NV, const int dt, const int W, const int silu) {
    const int G = 4 / NV;
    int64_t j = 0;
    for (; j + G <= nt; j += G) simd_tokens(xs + j * xt, xt, os + j * ot, ot, w, b, hf, G, NV, dt, W, silu);
    if (G > 2 && j + 2 <= nt) {
        simd_tokens(xs + j * xt, xt, os + j * ot, ot, w, b, hf, 2, NV, dt, W, silu);
        j += 2;
    }
    if (j < nt) simd_tokens(xs + j * xt, xt, os + j * ot, ot, w, b, hf, 1, NV, dt, W, silu);
}

/* Line steps of channels [ca, cb) (offsets in the unit's block) of one slab: its nt
 * tokens staged in buf rows H.. (bs bytes apart), outputs to os rows ot bytes apart; NV
 * vectors a step (a constant: update_simd.h's 64-byte line, or twice that for a single
 * token, SIMD_WIDE_T1), the weights, bias and window loaded per step, the tokens by
 * simd_token_groups. With prefetch, a line of each
 * of the next unit's rows per GDN_PF_EVERY bytes of the step. */
GDN_INLINE void simd_lines(const char *buf, int64_t bs, char *os, int64_t ot, int64_t ca, int64_t cb, int64_t nt,
                           const simd_weights *wt, const simd_next *nx, int prefetch, const int NV, const int dt,
                           const int W, const int silu, const int WP) {
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), step = NV * LANES;
    for (int64_t c = ca; c < cb; c += step) {
        V w[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
        if (prefetch) simd_prefetch_step(nx, c * e, step * e, 0, 0);
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            simd_taps(wt, c + v * LANES, w, b, v, W, WP);
#pragma GCC unroll 8
            for (int k = 0; k < H; k++) hf[k][v] = to_f32(ld_raw(buf + k * bs + (c + v * LANES) * e, dt), dt);
        }
        simd_token_groups(buf + H * bs + c * e, bs, os + c * e, ot, nt, w, b, hf, NV, dt, W, silu);
    }
}

#ifdef SIMD_SD_DIRECT
/* Decode of a channel-contiguous state without staging (request r's channels [0, nline)
 * of the unit's block at c0), for the requests SD_DIRECT_TAKES (spec and T constants
 * here). Per line step the window rows (off..off+W-2) and the tokens are loaded, the state
 * rolled in place from those registers (raw bits: rows 0..W-3 <- window rows 1..W-2, rows
 * W-2+t <- token t), then the outputs computed from the window's fp32 values and the
 * tokens (read again, from L1) and written, bit for bit the staged path's (out may be x:
 * every token is read before any output is written). The staging buffer keeps the ~2T+L
 * rows a request touches (often 4 KiB apart, one L1 set) from thrashing L1, but within
 * one line step each of them is read or written once here, and the staging copies took
 * 5-15% of a warm call (benchmarks/README.md, stops 42-43). A speculative request's rows
 * are prefetched first (those it only writes for writing), as the staged path's row
 * copies stream them; a plain request's few rows are not (the previous unit's prefetch of
 * the next unit issued them, but for a thread's first unit, one after a pad and one after a
 * last block shorter than its own; and the hardware's streams follow them: stop 58, cold
 * 0.95-1.01x). */
GDN_INLINE void sd_direct_T(const gdn_update_params *p, const gdn_request *r, int64_t c0, int64_t nline,
                            const simd_weights *wt, const simd_next *nx, const int NV, const int dt, const int W,
                            const int silu, const int WP, const int spec, const int T) {
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), sl = p->state_stride_l * e, step = NV * LANES, ve = LANES * e;
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e, off = spec ? r->off : 0;
    char *st = r->state + e * c0;
    const char *x = r->x + e * c0;
    char *os = r->out + e * c0;
    for (int64_t o = 0; spec && o < nline * e; o += 64) {
        for (int k = 0; k < H; k++) SIMD_PREFETCH_R(st + (off + k) * sl + o);
        for (int t = 0; t < T; t++) SIMD_PREFETCH_R(x + t * xt + o);
        for (int t = 0; t < T; t++) SIMD_PREFETCH_W(os + t * ot + o);
        for (int k = 0; k < W - 2 + T; k++)   /* the roll's rows outside the window */
            if (k < off || k >= off + H) SIMD_PREFETCH_W(st + k * sl + o);
    }
    for (int64_t c = 0; c < nline; c += step) {
        V w[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
        R seq[GDN_MAX_WIDTH - 1 + 4][4];   /* the window rows, then the tokens */
        const int64_t ce = c * e;
        simd_prefetch_step(nx, ce, step * e, T + H, spec ? 0 : T);   /* (the next request's T taken as this one's) */
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            simd_taps(wt, c + v * LANES, w, b, v, W, WP);
#pragma GCC unroll 8
            for (int k = 0; k < H; k++) {
                seq[k][v] = ld_raw(st + (off + k) * sl + ce + v * ve, dt);
                hf[k][v] = to_f32(seq[k][v], dt);
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) seq[H + t][v] = ld_raw(x + t * xt + ce + v * ve, dt);
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)   /* row k <- element k + 1 of the sequence */
#pragma GCC unroll 12
            for (int k = 0; k < H - 1 + T; k++) st_raw(st + k * sl + ce + v * ve, seq[k + 1][v], dt);
        simd_token_groups(x + ce, xt, os + ce, ot, T, w, b, hf, NV, dt, W, silu);
    }
}

/* sd_direct takes plain decode of one token, and speculative decode of up to 4 tokens at
 * widths up to 4 (the measured case: wider windows and more tokens would not leave the
 * registers that the window, the tokens and the taps take) */
#define SD_DIRECT_TAKES(spec, T, W) ((spec) ? (T) <= 4 && (W) <= 4 : (T) == 1)

GDN_INLINE void sd_direct(const gdn_update_params *p, const gdn_request *r, int64_t c0, int64_t nline,
                          const simd_weights *wt, const simd_next *nx, const int NV, const int dt, const int W,
                          const int silu, const int WP, const int spec) {
    if (!spec) {
        sd_direct_T(p, r, c0, nline, wt, nx, NV, dt, W, silu, WP, 0, 1);
        return;
    }
    switch (r->T) {
    case 1: sd_direct_T(p, r, c0, nline, wt, nx, NV, dt, W, silu, WP, 1, 1); break;
    case 2: sd_direct_T(p, r, c0, nline, wt, nx, NV, dt, W, silu, WP, 1, 2); break;
    case 3: sd_direct_T(p, r, c0, nline, wt, nx, NV, dt, W, silu, WP, 1, 3); break;
    default: sd_direct_T(p, r, c0, nline, wt, nx, NV, dt, W, silu, WP, 1, 4); break;   /* (T = 4) */
    }
}
#endif

#ifdef TC_T1
/* Short decode of a time-contiguous state with channel stride sd <= TC_T1_SD_MAX(dt)
 * (vLLM's DS layout: plain decode of one token, speculative decode of up to TC_T1_MAX_T
 * tokens), 32 channels (one group of the ISA header's tc_t1_rows_bf16, or tc_t1_row for
 * fp16, and tc_t1_roll; fp32: two halves of 16, tc_t1_row32 and tc_t1_roll32) at channel c of the block at st (row
 * 0), the T tokens at x (rows xt bytes apart), the outputs to os (ot apart), nothing
 * staged. The window (rows off..off+W-2) and the tokens are read, and the state rolled,
 * before the outputs are written (out may be x); the outputs are simd_token_groups' on
 * the same fp32 values, so they equal the staged path's bit for bit. (Two groups a step,
 * as the staged path's one-token steps take, measured 1.15x slower: the registers do not
 * hold them.) */
GDN_INLINE void tc_t1_step(char *st, const int sd, const char *x, int64_t xt, char *os, int64_t ot, const int T,
                           const int off, int64_t c, const simd_weights *wt, const simd_next *nx, const tc_t1_plan *t,
                           const int dt, const int W, const int silu, const int WP) {
    const int H = W - 1;
    V w[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
    const int e = gdn_elsize(dt);
    simd_prefetch_step(nx, c * e, 32 * e, T + sd, T);   /* (the next request's T taken as this one's) */
#pragma GCC unroll 2
    for (int v = 0; v < 2; v++) simd_taps(wt, c + v * LANES, w, b, v, W, WP);
    char *blk = st + e * c * sd;
    if (e == 4) {   /* fp32: two halves of 16 channels, each its own sd block vectors */
        __asm__("" : "+r"(t));
        __m512i sv[2 * TC_T1_MAX_SD], tok[2 * TC_T1_MAX_T];
#pragma GCC unroll 16
        for (int m = 0; m < 2 * sd - 1; m++) sv[m] = _mm512_loadu_si512(blk + 64 * m);
        sv[2 * sd - 1] = _mm512_maskz_loadu_epi32((__mmask16)t->last, blk + 64 * (2 * sd - 1));
#pragma GCC unroll 8
        for (int k = 0; k < H; k++) {
            hf[k][0] = tc_t1_row32(sv, t, off + k, sd);
            hf[k][1] = tc_t1_row32(sv + sd, t, off + k, sd);
        }
#pragma GCC unroll 4
        for (int q = 0; q < T; q++) {
            tok[2 * q] = _mm512_loadu_si512(x + q * xt + 4 * c);
            tok[2 * q + 1] = _mm512_loadu_si512(x + q * xt + 4 * c + 64);
        }
        tc_t1_roll32(blk, sv, tok, T, off, t, sd);
        simd_token_groups(x + 4 * c, xt, os + 4 * c, ot, T, w, b, hf, 2, dt, W, silu);
        return;
    }
    /* bf16 with several tokens: the plan's vectors loaded where used, not held in
     * registers across steps (the compiler spilled the token routine's vectors instead:
     * ds/sd 1.25 -> 1.14); fp16, whose conversion takes registers of its own, ran 1.20 ->
     * 1.25 that way, and so did bf16's one token once its rows took dword permutes (stop 54:
     * DS plain 1.20-1.23 held, 1.22-1.29 loaded, in 5 alternated rounds) */
    if (dt != GDN_F16 && T > 1) __asm__("" : "+r"(t));
    __m512i sv[TC_T1_MAX_SD], tok[TC_T1_MAX_T];
#pragma GCC unroll 8
    for (int m = 0; m < sd - 1; m++) sv[m] = _mm512_loadu_si512(blk + 64 * m);
    sv[sd - 1] = _mm512_maskz_loadu_epi16(t->last, blk + 64 * (sd - 1));
    if (dt == GDN_F16) {
#pragma GCC unroll 8
        for (int k = 0; k < H; k++) {
            hf[k][0] = tc_t1_row(sv, t, off + k, 0, sd);
            hf[k][1] = tc_t1_row(sv, t, off + k, 1, sd);
        }
    } else {
        tc_t1_rows_bf16(sv, t, off, 0, sd, H, hf);
        tc_t1_rows_bf16(sv, t, off, 1, sd, H, hf);
    }
#pragma GCC unroll 4
    for (int q = 0; q < T; q++) tok[q] = _mm512_loadu_si512(x + q * xt + 2 * c);
    tc_t1_roll(blk, sv, tok, T, off, t, sd, W - 2 + T >= sd);
    simd_token_groups(x + 2 * c, xt, os + 2 * c, ot, T, w, b, hf, 2, dt, W, silu);
}

/* tc_t1_unit takes plain decode of one token and speculative decode of up to
 * TC_T1_MAX_T tokens; the block holds their rows, since validation keeps W - 1 <= state_len
 * and W - 2 + T <= state_len, and state_len <= sd */
#define TC_T1_TAKES(spec, T) ((spec) ? (T) <= TC_T1_MAX_T : (T) == 1)
#define TC_T1_MAX_W 5
/* The dtype codes this file's kernel passes to simd_unit, which tc_t1_unit is
 * instantiated for: with GDN_SIMD_BF16_NATIVE (update_avx512bf16.c, whose kernel takes
 * bf16 calls only) GDN_BF16_NATIVE, else GDN_F16, GDN_BF16 and GDN_F32. Each
 * instantiation is ~200 kB of code (dtype x width x activation x mode x channel stride x tokens): the one
 * never called took update_avx512.c's compile from 187 to 334 s. */
#ifdef GDN_SIMD_BF16_NATIVE
#define TC_T1_DTYPE(dt) ((dt) == GDN_BF16_NATIVE)
#else
#define TC_T1_DTYPE(dt) ((dt) == GDN_F16 || (dt) == GDN_BF16 || (dt) == GDN_F32)
#endif
/* The channel strides tc_t1_unit takes: fp32 up to 4 (vLLM's DS layout at W <= 5 in plain
 * decode, transformers' view at W <= 4; 2 sd block vectors a group), 16-bit all. The fp32
 * instantiation takes update_avx512.c's compile from 2.9 to 4.3 minutes on the 2-core VM;
 * at every sd it took 7.7. */
#define TC_T1_SD_MAX(dt) ((dt) == GDN_F32 ? 4 : TC_T1_MAX_SD)

/* The unit's requests that TC_T1_TAKES (the others: simd_unit), for constant dtype,
 * width, activation and mode. */
GDN_INLINE void tc_t1_requests(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t nline,
                               const simd_weights *wt, const int dt, const int W, const int silu, const int WP,
                               const int spec) {
    const int sd = (int)p->state_stride_d, e = gdn_elsize(dt);
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e;
    tc_t1_plan t;
    tc_t1_plan_make(&t, sd, W - 1, (int)p->state_len, dt, spec ? sd : W - 1, spec ? TC_T1_MAX_T : 1);
    for (int64_t i = r0; i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (r.skip || !TC_T1_TAKES(spec, r.T)) continue;
        simd_next nx;
        simd_next_rows(p, i, c0, &nx);
        char *st = r.state + e * c0 * sd;
        const char *x = r.x + e * c0;
        char *os = r.out + e * c0;
        const int off = spec ? (int)r.off : 0;
        int64_t c = 0;
        /* (instantiated where the block holds the rows: W - 1 <= sd, W - 2 + T <= sd) */
#define TC_T1_T(SD, T)                                                                                      \
    do {                                                                                                    \
        if (W - 2 + T <= SD)                                                                                \
            for (; c < nline; c += 32) tc_t1_step(st, SD, x, xt, os, ot, T, off, c, wt, &nx, &t, dt, W, silu, WP); \
    } while (0)
#define TC_T1_SD(SD)                            \
    if (W - 1 > SD || SD > TC_T1_SD_MAX(dt)) break; \
    if (!spec) TC_T1_T(SD, 1);                  \
    else switch (r.T) {                         \
        case 1: TC_T1_T(SD, 1); break;          \
        case 2: TC_T1_T(SD, 2); break;          \
        case 3: TC_T1_T(SD, 3); break;          \
        default: TC_T1_T(SD, 4); break;         \
        }
        switch (sd) {
        case 2: TC_T1_SD(2) break;
        case 3: TC_T1_SD(3) break;
        case 4: TC_T1_SD(4) break;
        case 5: TC_T1_SD(5) break;
        case 6: TC_T1_SD(6) break;
        case 7: TC_T1_SD(7) break;
        default: TC_T1_SD(8) break;
        }
#undef TC_T1_SD
#undef TC_T1_T
    }
}

/* The dispatch to tc_t1_requests (W <= TC_T1_MAX_SD + 1, since W - 1 <= sd): one function
 * for every instantiation of simd_unit, not inlined into it, whose staged path ran 28%
 * slower when this shared its frame and registers. */
static GDN_NOINLINE void tc_t1_unit(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t nline,
                                    const simd_weights *wt, const int dt, const int silu, const int spec) {
#define TC_T1_W(DT, S, SP)                                                                          \
    switch (p->width) {                                                                             \
    case 2: tc_t1_requests(p, r0, r1, c0, nline, wt, DT, 2, S, 0, SP); break;                       \
    case 3: tc_t1_requests(p, r0, r1, c0, nline, wt, DT, 3, S, 0, SP); break;                       \
    case 4:                                                                                         \
        if (DT != GDN_F16 && DT != GDN_F32 && wt->packed) tc_t1_requests(p, r0, r1, c0, nline, wt, DT, 4, S, 1, SP); \
        else tc_t1_requests(p, r0, r1, c0, nline, wt, DT, 4, S, 0, SP);                             \
        break;                                                                                      \
    default: tc_t1_requests(p, r0, r1, c0, nline, wt, DT, 5, S, 0, SP); break;                      \
    }
#ifdef GDN_SIMD_BF16_NATIVE
#define TC_T1_DT(S, SP) TC_T1_W(GDN_BF16_NATIVE, S, SP)   /* (TC_T1_DTYPE: dt is GDN_BF16_NATIVE) */
#else
#define TC_T1_DT(S, SP)                                                                             \
    switch (dt) {                                                                                   \
    case GDN_F16: TC_T1_W(GDN_F16, S, SP) break;                                                    \
    case GDN_F32: TC_T1_W(GDN_F32, S, SP) break;                                                    \
    default: TC_T1_W(GDN_BF16, S, SP) break;                    /* (TC_T1_DTYPE: GDN_BF16) */       \
    }
#endif
    if (spec) {
        if (silu) TC_T1_DT(1, 1)
        else TC_T1_DT(0, 1)
    } else {
        if (silu) TC_T1_DT(1, 0)
        else TC_T1_DT(0, 0)
    }
#undef TC_T1_DT
#undef TC_T1_W
}
#endif

/* One (requests, channel block) unit for constant dtype, width and activation.
 *
 * Every row a request touches is staged through a small buffer, row by row: the
 * rows of x, out and conv_state are often a multiple of 4 KiB apart, so reading
 * or writing one channel position in all ~2T+L of them at once lands every line in
 * one L1 set, which thrashes (measured at B=1, D=8192 bf16: 2.9 ns per channel,
 * against 1.0 when D=8704). The exceptions go in place: short decode requests of a
 * channel-contiguous state (sd_direct), one-token requests of a 16-bit
 * time-contiguous one (tc_t1_unit). Per slab of up to GDN_SLAB tokens:
 *   buf rows 0..H-1 = the window (conv_state rows off..off+H-1, then the last H
 *   inputs of the previous slab), rows H.. = the slab's tokens (raw bits);
 *   the state roll is written from buf (state_out: row by row, or transposed for a
 *   time-contiguous state, as state_in read the window; or in place, tc_roll, for a
 *   time-contiguous state in speculative mode); the convolution reads buf,
 *   with weights and history in registers, and writes out. Everything is read
 *   before anything is written, so out may be x. */
GDN_INLINE void simd_unit(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          const simd_weights *wt, const int dt, const int W, const int silu, const int WP) {
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), ve = LANES * e, sl = p->state_stride_l * e;
    const int64_t sd = p->state_stride_d;   /* 1, or > 1: time-contiguous */
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e;
    const int NV = ve >= 64 ? 1 : 64 / ve > 4 ? 4 : (int)(64 / ve);  /* vectors per line step */
    const int64_t step = NV * LANES, nline = (c1 - c0) / step * step, bytes = nline * e;
    const int64_t bs = p->block_channels * e;        /* buf row stride */
    const int spec = p->num_accepted_tokens != NULL;
    GDN_ALIGN64 char buf[(GDN_MAX_WIDTH - 1 + GDN_SLAB) * GDN_BLOCK_CHANNELS_MAX * 4];
#ifdef TC_T1
    /* short decode of a time-contiguous state: in place (tc_t1_unit), in groups of 32
     * channels. fp32 line steps are 16 channels: a unit whose line steps end half way
     * through a group is staged whole (its channels past the last group would otherwise
     * take the element loops, whose results differ from the SIMD ones in the last bits) */
    const int t1 = TC_T1_DTYPE(dt) && sd > 1 && sd <= TC_T1_SD_MAX(dt) && H <= sd && W <= TC_T1_MAX_W &&
                   nline > 0 && nline % 32 == 0;
    if (t1) tc_t1_unit(p, r0, r1, c0, nline, wt, dt, silu, spec);
#endif
    for (int64_t i = r0; i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (r.skip) continue;
#ifdef TC_T1
        if (t1 && TC_T1_TAKES(spec, r.T)) {   /* (done above, but for the channels after the last line step) */
            if (nline < c1 - c0) gdn_update_scalar_range(p, &r, 1, c0 + nline, c1);
            continue;
        }
#endif
        simd_next nx;
        simd_next_rows(p, i, c0, &nx);
        char *st = r.state + e * c0 * sd;   /* row 0 at channel c0 */
#ifdef SIMD_SD_DIRECT
        if (sd == 1 && nline > 0 && SD_DIRECT_TAKES(spec, r.T, W)) {
            sd_direct(p, &r, c0, nline, wt, &nx, NV, dt, W, silu, WP, spec);
        } else
#endif
        if (nline > 0) {
            state_in(buf, bs, st + r.off * sl, sl, sd, H, nline, p->dim - c0, p->dtype);
            for (int64_t t0 = 0; t0 < r.T; t0 += GDN_SLAB) {
                const int64_t nt = r.T - t0 < GDN_SLAB ? r.T - t0 : GDN_SLAB;
                for (int64_t j = 0; j < nt; j++)
                    simd_copy(buf + (H + j) * bs, r.x + e * c0 + (t0 + j) * xt, bytes);
                if (spec && t0 == 0) {  /* the roll: rows 0..W-3 <- window rows 1..W-2, rows W-2+t <- x[t] */
#ifdef TC_ROLL
                    if (sd > 1)   /* window rows 1..W-2 are old rows off+1.. in place */
                        tc_roll(st, sd, r.off + 1, H - 1, buf + H * bs, bs, (int)nt, nline, p->dtype);
                    else
#endif
                        state_out(st, sl, sd, H - 1 + (int)nt, buf + bs, bs, nline, p->dtype);
                } else if (spec)
                    state_out(st + (W - 2 + t0) * sl, sl, sd, (int)nt, buf + H * bs, bs, nline, p->dtype);
                char *os = r.out + e * c0 + t0 * ot;
#ifdef SIMD_WIDE_T1
                /* one token: twice the vectors a step, so that each step has as many
                 * independent chains as a group of tokens has (the SiLU chain is long) */
                const int NVW = NV < 4 ? 2 * NV : 4;
                const int64_t wide = nt == 1 ? nline / (NVW * LANES) * (NVW * LANES) : 0;
                simd_lines(buf, bs, os, ot, 0, wide, nt, wt, &nx, t0 == 0, NVW, dt, W, silu, WP);
#else
                const int64_t wide = 0;
#endif
                simd_lines(buf, bs, os, ot, wide, nline, nt, wt, &nx, t0 == 0, NV, dt, W, silu, WP);
                if (t0 + nt < r.T)  /* the last H inputs become the next slab's window */
                    simd_copy(buf, buf + nt * bs, H * bs);
            }
            if (!spec)  /* rows 0..W-2 <- the last W-1 inputs: buf rows from the last slab's size on */
                state_out(st, sl, sd, H, buf + ((r.T - 1) % GDN_SLAB + 1) * bs, bs, nline, p->dtype);
        }
        if (nline < c1 - c0) gdn_update_scalar_range(p, &r, 1, c0 + nline, c1);
    }
}

#define SIMD_UNIT_WIDTHS(dt, silu)                                                      \
    switch (p->width) {                                                                 \
    case 2: simd_unit(p, r0, r1, c0, c1, &wt, dt, 2, silu, 0); break;                   \
    case 3: simd_unit(p, r0, r1, c0, c1, &wt, dt, 3, silu, 0); break;                   \
    case 4: simd_unit(p, r0, r1, c0, c1, &wt, dt, 4, silu, 0); break;                   \
    case 5: simd_unit(p, r0, r1, c0, c1, &wt, dt, 5, silu, 0); break;                   \
    case 6: simd_unit(p, r0, r1, c0, c1, &wt, dt, 6, silu, 0); break;                   \
    case 7: simd_unit(p, r0, r1, c0, c1, &wt, dt, 7, silu, 0); break;                   \
    default: simd_unit(p, r0, r1, c0, c1, &wt, dt, 8, silu, 0); break;                  \
    }

#define SIMD_UNIT_DTYPES(silu)                                                          \
    switch (p->dtype) {                                                                 \
    case GDN_F32: SIMD_UNIT_WIDTHS(GDN_F32, silu) break;                                \
    case GDN_F16: SIMD_UNIT_WIDTHS(GDN_F16, silu) break;                                \
    default: SIMD_UNIT_WIDTHS(GDN_BF16, silu) break;                                    \
    }

/* Weights of channels c0.. from a contiguous (D, W) array to W fp32 tap rows
 * (w[k * ld + c]), LANES channels at a time: W vector loads of the channel-major
 * block [LANES, W], then per tap a lane permute (gather_taps), or the ISA's
 * taps_block where it takes the dtype and width (SIMD_TAPS_BLOCK). */
GDN_INLINE void simd_fill_weights(const gdn_update_params *p, int64_t c0, int64_t nvec, float *w, int64_t ld,
                                  const int wdt, const int W) {
    const int64_t e = gdn_elsize(wdt);
    for (int64_t c = 0; c < nvec; c += LANES) {
        const char *src = (const char *)p->weight + e * (c0 + c) * W;   /* [LANES, W] */
        V t[GDN_MAX_WIDTH];
#ifdef SIMD_TAPS_BLOCK
        if (SIMD_TAPS_BLOCK(wdt, W)) {
            taps_block(src, wdt, W, t);
        } else
#endif
        {
            V v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
            for (int m = 0; m < W; m++) v[m] = to_f32(ld_raw(src + e * m * LANES, wdt), wdt);
#pragma GCC unroll 8
            for (int k = 0; k < W; k++) t[k] = gather_taps(v, W, k);
        }
#pragma GCC unroll 8
        for (int k = 0; k < W; k++) vstore(w + k * ld + c, t[k]);
    }
}

#define SIMD_FILL_WIDTHS(wdt)                                                             \
    switch (p->width) {                                                                   \
    case 2: simd_fill_weights(p, c0, nvec, w, ld, wdt, 2); break;                         \
    case 3: simd_fill_weights(p, c0, nvec, w, ld, wdt, 3); break;                         \
    case 4: simd_fill_weights(p, c0, nvec, w, ld, wdt, 4); break;                         \
    case 5: simd_fill_weights(p, c0, nvec, w, ld, wdt, 5); break;                         \
    case 6: simd_fill_weights(p, c0, nvec, w, ld, wdt, 6); break;                         \
    case 7: simd_fill_weights(p, c0, nvec, w, ld, wdt, 7); break;                         \
    default: simd_fill_weights(p, c0, nvec, w, ld, wdt, 8); break;                        \
    }

/* The bias of channels [c0, c0 + n) as fp32 (n a multiple of LANES). */
GDN_INLINE void simd_fill_bias(const gdn_update_params *p, int64_t c0, int64_t n, float *b) {
    const int wdt = p->weight_dtype;
    if (p->bias && p->bias_stride == 1) {
        for (int64_t c = 0; c < n; c += LANES)
            vstore(b + c, to_f32(ld_raw((const char *)p->bias + gdn_elsize(wdt) * (c0 + c), wdt), wdt));
    } else {
        gdn_fill_bias(p, c0, n, b);
    }
}

/* Weights and bias of channels [c0, c1) as fp32, tap-major (w[k * ld + c], b[c]):
 * whole vectors here, the rest through the scalar conversion. */
GDN_INLINE void simd_fill(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b) {
    const int64_t nvec = (c1 - c0) / LANES * LANES;
    const int wdt = p->weight_dtype;
    if (gdn_weight_bf16_packed(p)) {   /* (c0 is a multiple of 32: a block's or the call's first) */
        for (int64_t c = 0; c < nvec; c += LANES) {
            V t[4];
            simd_packed_taps((const uint16_t *)p->weight, c0 + c, t);
            for (int k = 0; k < 4; k++) vstore(w + k * ld + c, t[k]);
        }
    } else if (p->weight_stride_w == 1 && p->weight_stride_d == p->width && !p->is_weight_packed) {
        if (wdt == GDN_F32) SIMD_FILL_WIDTHS(GDN_F32)
        else if (wdt == GDN_F16) SIMD_FILL_WIDTHS(GDN_F16)
        else SIMD_FILL_WIDTHS(GDN_BF16)
    } else {
        gdn_fill_weights_any(p, c0, nvec, w, ld, b);
    }
    simd_fill_bias(p, c0, nvec, b);
    if (nvec < c1 - c0) gdn_fill_weights_any(p, c0 + nvec, c1 - c0 - nvec, w + nvec, ld, b + nvec);
}

/* The kernel; bf16_native (a constant) is for bf16 calls only and stores bf16 with
 * the ISA's conversion instruction (dtype code GDN_BF16_NATIVE) instead of integer
 * rounding. */
GDN_INLINE void simd_kernel(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                            const int bf16_native) {
    /* fp32 weights with unit channel stride (pack_weight's layout, or the call's
     * converted copy: see update.c) and vLLM's packed bf16 weight are read in place;
     * any other weights are converted once per unit, tap-major. */
    GDN_ALIGN64 float wbuf[GDN_MAX_WIDTH][GDN_BLOCK_CHANNELS_MAX];
    GDN_ALIGN64 float bbuf[GDN_BLOCK_CHANNELS_MAX];
    simd_weights wt = {{NULL}, NULL, bbuf};
    const int64_t nvec = (c1 - c0) / LANES * LANES;
    if (gdn_weight_f32_rows(p)) {
        for (int64_t k = 0; k < p->width; k++) wt.row[k] = (const float *)p->weight + c0 + k * p->weight_stride_w;
        if (p->bias && p->bias_stride == 1) wt.bias = (const float *)p->bias + c0;
        else gdn_fill_bias(p, c0, nvec, bbuf);
    } else if (gdn_weight_bf16_packed(p)) {   /* (x is bf16 too, W = 4; c0 a multiple of 32) */
        wt.packed = (const uint16_t *)p->weight + c0 * 4;
        simd_fill_bias(p, c0, nvec, bbuf);
        if (bf16_native) {
            if (p->silu) simd_unit(p, r0, r1, c0, c1, &wt, GDN_BF16_NATIVE, 4, 1, 1);
            else simd_unit(p, r0, r1, c0, c1, &wt, GDN_BF16_NATIVE, 4, 0, 1);
        } else if (p->silu) {
            simd_unit(p, r0, r1, c0, c1, &wt, GDN_BF16, 4, 1, 1);
        } else {
            simd_unit(p, r0, r1, c0, c1, &wt, GDN_BF16, 4, 0, 1);
        }
        return;
    } else {
        simd_fill(p, c0, c0 + nvec, &wbuf[0][0], GDN_BLOCK_CHANNELS_MAX, bbuf);
        for (int64_t k = 0; k < p->width; k++) wt.row[k] = wbuf[k];
    }
    if (bf16_native) {
        if (p->silu) SIMD_UNIT_WIDTHS(GDN_BF16_NATIVE, 1)
        else SIMD_UNIT_WIDTHS(GDN_BF16_NATIVE, 0)
    } else if (p->silu) {
        SIMD_UNIT_DTYPES(1)
    } else {
        SIMD_UNIT_DTYPES(0)
    }
}


/* The ISA table, best first (one row per ISA, one entry per op), and the selection
 * of the active row. */
#include "isa.h"

#define F(name) GDN_FEATURE_BIT(GDN_FEATURE_##name)
#define AVX2_FEATURES (F(OS_AVX) | F(AVX) | F(AVX2) | F(FMA) | F(F16C))
#define AVX512_FEATURES (AVX2_FEATURES | F(OS_AVX512) | F(AVX512F) | F(AVX512BW) | F(AVX512VL) | F(AVX512DQ))

/* Best first; the first supported row is the default; the portable row is last. */
static const gdn_isa table[] = {
#ifdef GDN_HAVE_X86_SIMD
    {"avx512bf16", AVX512_FEATURES | F(AVX512_BF16), gdn_update_avx512bf16, 1,
     gdn_fill_avx512, 1, gdn_prefill_avx512bf16},
    {"avx512", AVX512_FEATURES, gdn_update_avx512, 1, gdn_fill_avx512, 1, gdn_prefill_avx512},
    {"avx2", AVX2_FEATURES, gdn_update_avx2, 1, gdn_fill_avx2, 1, gdn_prefill_avx2},
#endif
#ifdef GDN_HAVE_NEON_SIMD
    {"neonbf16", F(ASIMD) | F(BF16), gdn_update_neonbf16, 1, gdn_fill_neon, 1, gdn_prefill_neonbf16},
    {"neon", F(ASIMD), gdn_update_neon, 1, gdn_fill_neon, 1, gdn_prefill_neon},
#endif
    {"scalar", 0, gdn_update_scalar, 0, NULL, GDN_BLOCK_REQUESTS, gdn_prefill_scalar},
};
#define COUNT ((int)(sizeof(table) / sizeof(table[0])))

static int active = COUNT - 1;

int gdn_isa_count(void) { return COUNT; }
const char *gdn_isa_name(int i) { return i >= 0 && i < COUNT ? table[i].name : NULL; }

int gdn_isa_supported(int i) {
    if (i < 0 || i >= COUNT) return 0;
    for (int f = 0; f < GDN_FEATURE_COUNT; f++)
        if ((table[i].requires & GDN_FEATURE_BIT(f)) && !gdn_cpu_has(f)) return 0;
    return 1;
}

const char *gdn_active_isa(void) { return table[active].name; }
const gdn_isa *gdn_isa_active(void) { return &table[active]; }
const gdn_isa *gdn_isa_portable(void) { return &table[COUNT - 1]; }

int gdn_select_isa(const char *name) {
    for (int i = 0; i < COUNT; i++) {
        if (name ? strcmp(name, table[i].name) != 0 : !gdn_isa_supported(i)) continue;
        if (!gdn_isa_supported(i)) return -2;
        active = i;
        return 0;
    }
    return -1;
}

/* The implementation table: one row per ISA, with the features it needs and one
 * entry per op; chosen once (isa.c). */
#ifndef GDNCONV_ISA_H
#define GDNCONV_ISA_H

#include "prefill.h"

#define GDN_FEATURE_BIT(f) (1u << (f))

typedef struct gdn_isa {
    const char *name;                /* lower case: file suffix, GDNCONV_ISA value, test id */
    uint32_t requires;               /* GDN_FEATURE_BIT()s this ISA needs */
    /* the update: its kernel for x and out with unit channel stride; whether that kernel
     * also takes a time-contiguous conv_state (time stride 1, channel stride >= L; 0: the
     * portable kernel takes it); the weight conversion into a thread's scratch (NULL:
     * the kernel converts its own); requests per unit */
    gdn_update_kernel_fn update;
    int update_tc;
    gdn_fill_fn update_fill;
    int update_requests_per_unit;
    /* the prefill: its kernel for x and out with unit channel stride */
    gdn_prefill_kernel_fn prefill;
} gdn_isa;

/* The ISA calls use now (gdn_select_isa), and the portable one, which takes any
 * strides. */
const gdn_isa *gdn_isa_active(void);
const gdn_isa *gdn_isa_portable(void);

#endif

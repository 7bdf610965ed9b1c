/* The one self-overlap rule of written arrays, for the Cython layer (_checks.pxi's
 * _refuse_self_overlap) and the torch op (torch_op.c): both take exactly the same layouts. */
#ifndef GDNCONV_LAYOUT_H
#define GDNCONV_LAYOUT_H

#include <stdint.h>

/* 1 when every element of the (ndim <= 3) array of this shape and these strides (in
 * elements, either sign) has its own memory, shown by sorting the dimensions by |stride|:
 * each |stride| beyond the span of the smaller ones (sufficient; a few interleaved layouts
 * without overlap are refused). An array without elements has no overlap. */
static inline int gdn_no_self_overlap(int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t s[3], n[3], span = 0;
    int k = 0;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] > 1) {
            const int64_t a = strides[i] < 0 ? -strides[i] : strides[i];
            int j = k++;
            for (; j > 0 && s[j - 1] > a; j--) {
                s[j] = s[j - 1];
                n[j] = n[j - 1];
            }
            s[j] = a;
            n[j] = shape[i];
        }
    for (int i = 0; i < k; i++) {
        if (s[i] <= span) return 0;
        span += (n[i] - 1) * s[i];
    }
    return 1;
}

#endif

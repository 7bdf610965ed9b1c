/* Portable kernel (any ISA, any strides): the scalar core over a unit of work. */
#include "conv_common.h"

void gdn_kernel_scalar(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t i = r0; i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (!r.skip) gdn_scalar_range(p, &r, c0, c1);
    }
}

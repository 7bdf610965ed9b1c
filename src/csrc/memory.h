/* Memory advice for arrays the Python layer allocates (memory.c). */
#ifndef GDNCONV_MEMORY_H
#define GDNCONV_MEMORY_H

#include <stdint.h>

/* The smallest array given huge-page advice: NumPy's threshold for its own arrays. */
#define GDN_HUGE_ADVICE_BYTES (4 << 20)

/* Advise huge pages (Linux MADV_HUGEPAGE) for the whole pages inside [p, p + bytes)
 * when bytes >= GDN_HUGE_ADVICE_BYTES; meant for new memory before its first touch.
 * Advice only: nothing is reported (no THP, another OS: nothing happens). */
void gdn_advise_huge_pages(void *p, int64_t bytes);

#endif

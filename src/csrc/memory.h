/* Memory for arrays the Python layer allocates (memory.c): huge-page advice, and the
 * blocks that large new outputs reuse. */
#ifndef GDNCONV_MEMORY_H
#define GDNCONV_MEMORY_H

#include <stdint.h>

/* The smallest array given huge-page advice: NumPy's threshold for its own arrays. */
#define GDN_HUGE_ADVICE_BYTES (4 << 20)

/* Advise huge pages (Linux MADV_HUGEPAGE) for the whole pages inside [p, p + bytes)
 * when bytes >= GDN_HUGE_ADVICE_BYTES; meant for new memory before its first touch.
 * Advice only: nothing is reported (no THP, another OS: nothing happens). */
void gdn_advise_huge_pages(void *p, int64_t bytes);

/* The smallest new output that takes a reused block (the huge-page advice's size).
 * glibc's malloc hands a freed block back to the OS when it is over its mmap threshold
 * (raised by frees of larger mapped blocks, to 32 MiB at most); torch's aligned
 * requests of one size are then mapped afresh every time, and each new mapping is first
 * touched page by page, zeroed (with huge pages advised, at the cost of compaction). */
#define GDN_REUSE_MIN_BYTES GDN_HUGE_ADVICE_BYTES
/* Blocks are whole multiples of this, aligned to it (a huge page on x86-64 and aarch64). */
#define GDN_BLOCK_ALIGN (2 << 20)
/* Where in its block an output starts: 1088 bytes (17 lines) past the 2 MiB boundary, so
 * that its rows do not share their offset within a 4 KiB page with the input rows'
 * (malloc's arrays start 16 or 64 bytes into a page): a D=8192 4x1024 bf16 prefill into
 * an out at a page boundary took 5298-5608 us, 16 bytes in (x's offset) 5758-5920, 1088
 * bytes in 5053-5157 (2-core Xeon, two threads; likely loads of x that alias earlier
 * stores to out in their low 12 address bits, and wait for them). */
#define GDN_BLOCK_SKEW 1088
/* What the cache may hold by default. */
#define GDN_BLOCK_CACHE_DEFAULT (256LL << 20)

/* A block of at least `bytes` (its size in *size): the smallest cached one that is no
 * more than twice that, else a new anonymous mapping (huge-page advice when `huge`).
 * NULL where `bytes` < GDN_REUSE_MIN_BYTES, the cache's limit is 0 (reuse off), the
 * mapping fails or the OS is not Linux: the caller allocates as usual. Thread-safe. */
void *gdn_block_take(int64_t bytes, int huge, int64_t *size);
/* A block from gdn_block_take back: cached while the cache can hold it (the oldest
 * blocks unmapped to make room), else unmapped. Thread-safe. */
void gdn_block_give(void *p, int64_t size);
/* The cache's limit in bytes (unmapping what no longer fits); returns the previous
 * limit. 0 turns the reuse off. */
int64_t gdn_block_cache_limit(int64_t bytes);
/* Bytes the cache holds now (blocks no array uses). */
int64_t gdn_block_cache_held(void);

#endif

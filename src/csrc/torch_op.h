/* gdnconv's decode as a torch op on torch's stable C ABI (torch_op.c). */
#ifndef GDNCONV_TORCH_OP_H
#define GDNCONV_TORCH_OP_H

/* Flags of the op's `flags` argument (gdnconv.vllm's _OP_* mirror them). */
#define GDN_OP_SILU 1
#define GDN_OP_TOKENS_LAST 2     /* x (and out) (B, T, D), vLLM's C++ op's order; else (B, D, T) */
#define GDN_OP_PACKED 4          /* is_weight_packed */
#define GDN_OP_SKIPPED_FROM_X 8  /* out rows of skipped requests take x's values */
#define GDN_OP_BIAS 16           /* each: the argument is given (else its place holds x) */
#define GDN_OP_ACCEPTED 32
#define GDN_OP_INDICES 64

/* Resolve the shim functions from the loaded libtorch at `libtorch_path` and register
 * the ops (once per process). 0: registered (now or before); negative: this torch
 * lacks what the ops need (no dlopen, libtorch not loaded, a function missing), or a
 * registration failed; nothing is registered then. */
int gdn_torch_op_init(const char *libtorch_path);

/* The thread request (gdn_update_run's num_threads) of calls through the ops: the
 * Cython layer's _call_threads(None), kept current by it. */
void gdn_torch_op_threads(int request);

#endif

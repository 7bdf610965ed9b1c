/* gdnconv's decode as a torch op on torch's stable C ABI (torch_op.c). */
#ifndef GDNCONV_TORCH_OP_H
#define GDNCONV_TORCH_OP_H

#include <stddef.h>
#include <stdint.h>

/* Flags of the op's `flags` argument (gdnconv.vllm's _OP_* mirror them). */
#define GDN_OP_SILU 1
#define GDN_OP_TOKENS_LAST 2     /* x (and out) (B, T, D), vLLM's C++ op's order; else (B, D, T) */
#define GDN_OP_PACKED 4          /* is_weight_packed */
#define GDN_OP_SKIPPED_FROM_X 8  /* out rows of skipped requests take x's values */
#define GDN_OP_BIAS 16           /* each: the argument is given (else its place holds x) */
#define GDN_OP_ACCEPTED 32
#define GDN_OP_INDICES 64
#define GDN_OP_VARLEN 128        /* query_start_loc given: x (and out) (N, D) */

/* Resolve the shim functions from the loaded libtorch at `libtorch_path` and register
 * the ops (once per process). 0: registered (now or before); negative: this torch
 * lacks what the ops need (no dlopen, libtorch not loaded, a function missing), or a
 * registration failed; nothing is registered then. */
int gdn_torch_op_init(const char *libtorch_path);

/* The thread request (gdn_update_run's num_threads) of calls through the ops: the
 * Cython layer's _call_threads(None), kept current by it. */
void gdn_torch_op_threads(int request);

/* The ops' call without torch's dispatcher, on torch.Tensor Python objects the caller
 * holds (torch_op.c). gdn_torch_direct_init (after gdn_torch_op_init; with the GIL,
 * `header` PyObject_HEAD's size, *probe a new reference the caller releases): 0 when
 * the calls are possible. gdn_torch_direct: objs the op's tensor arguments in its order
 * (x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices, query_start_loc[,
 * out]; an absent
 * one's place holds x), the op's flags and pad_slot_id; 1 when the kernel ran (no GIL
 * needed), with the new out's handle in *new_out unless `into`; 0 refused, nothing
 * written. gdn_torch_wrap (with the GIL): that handle as a new Python object (a new
 * reference; NULL with a Python error set), the handle freed. */
int gdn_torch_direct_init(const char *libtorch_python_path, size_t header, void **probe);
int gdn_torch_direct(void *const objs[8], int into, int64_t flags, int64_t pad, void **new_out);
void *gdn_torch_wrap(void *tensor);

#endif

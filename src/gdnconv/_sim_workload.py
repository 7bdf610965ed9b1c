"""The simulator's workload and ground truth: the decode schedule (requests joining and
leaving, their prompts, drafts, acceptance, pads), the model's random weights and token pool, and the
checker that compares each step's outputs with a float64 reference over each
request's own accepted tokens. Used by ``gdnconv.simulate``."""
import math
from dataclasses import dataclass

import numpy as np

from gdnconv.reference import silu
from gdnconv.testing import error_ratio

PAD_SLOT_ID = -1


# ---------------------------------------------------------------------------- workload

@dataclass
class Step:
    """Everything one decode step needs, generated before anything is timed.

    Token values are rows of a shared random token pool: ``tokens[j]`` is the pool row
    fed as row ``j`` of ``x``. Row ``zero_row`` of the float64 pool is all zeros (the
    history of a request before its first token).
    """
    query_start_loc: np.ndarray     # (B+1,) int32
    slots: np.ndarray               # (B,) int32 conv_state_indices, PAD_SLOT_ID for empty positions
    num_accepted: np.ndarray        # (B,) int32 accepted tokens of the previous step (1 for new / pad)
    tokens: np.ndarray              # (N,) pool rows fed through x
    resets: np.ndarray              # slots handed to new requests: zeroed before this step
    rows: np.ndarray                # rows of x that belong to live requests (each output checked)
    windows: np.ndarray             # (len(rows), W) pool rows of each checked output's window
    pad_rows: np.ndarray            # rows of x passed for pad entries: their out must stay untouched
    request_ids: np.ndarray         # (B,) request served by each batch position, -1 for pad
    accepted: np.ndarray            # (B,) how many of this step's tokens were accepted (0 for pad)
    live_tokens: int                # len(rows): tokens of live requests
    prefill: "Prefill | None" = None    # prompts of the requests joining at this step, run before it


@dataclass(frozen=True)
class Prefill:
    """The prompts of the requests that join at one step: one varlen conv_prefill call
    before the step, with has_initial_state false (the slots' stale content must not be
    read). Fields as in ``Step``; the checker reads them the same way."""
    query_start_loc: np.ndarray     # (P+1,) int32
    slots: np.ndarray               # (P,) int32 cache_indices
    tokens: np.ndarray              # (n,) pool rows of the prompts, end to end
    rows: np.ndarray                # arange(n): every prompt output is checked
    windows: np.ndarray             # (n, W) pool rows of each output's window (zero row before the prompt)
    pad_rows: np.ndarray            # empty: no pad entries in a prefill
    request_ids: np.ndarray         # (P,)


class _Request:
    """Simulator-side bookkeeping for one request: its slot, the pool rows of its last
    W-1 accepted tokens (the ground-truth history), and the count to pass next step."""

    def __init__(self, rid, slot, width, zero_row, steps_left):
        self.rid = rid
        self.slot = slot
        self.history = [zero_row] * (width - 1)
        self.num_accepted = 1          # first step: zeroed slot, window starts at row 0
        self.steps_left = steps_left


def build_schedule(rng, *, batch, drafts, steps, num_slots, width, pool_size, accept_rate, mean_life,
                   prompt_len=0):
    """The whole decode run as a list of ``Step`` (index arrays only, no token data).

    Batch positions hold a request or are empty (passed as pad entries with 0..1+drafts
    junk tokens). A request lives a geometric number of steps (mean ``mean_life``), then
    frees its slot; its position stays empty for a geometric gap (often zero steps) and a
    new request takes a random free slot, which is zeroed before its first step, or with
    ``prompt_len > 0`` seeded by a prefill of a prompt of 1..prompt_len pool rows (the
    slot is then not zeroed). Each step a live request feeds ``1 + k`` tokens, ``k`` uniform in ``0..drafts``, and
    accepts ``1 +`` the number of leading drafts accepted with probability ``accept_rate``.
    """
    zero_row = pool_size
    free = list(range(num_slots))
    positions = [None] * batch
    wait = list(rng.geometric(0.5, size=batch) - 1)   # staggered start
    next_rid = 0
    schedule = []
    for _ in range(steps):
        resets = []
        p_qsl, p_slots, p_tokens, p_windows, p_rids = [0], [], [], [], []
        for b in range(batch):                        # new requests join empty positions
            if positions[b] is None and wait[b] <= 0:
                slot = free.pop(int(rng.integers(len(free))))
                req = _Request(next_rid, slot, width, zero_row, int(rng.geometric(1.0 / mean_life)))
                if prompt_len > 0:                    # prefill: history = the prompt's last W-1 rows
                    prompt = rng.integers(0, pool_size, size=int(rng.integers(1, prompt_len + 1))).tolist()
                    seq = req.history + prompt
                    p_windows.extend(seq[t:t + width] for t in range(len(prompt)))
                    p_tokens.extend(prompt)
                    p_qsl.append(p_qsl[-1] + len(prompt))
                    p_slots.append(slot)
                    p_rids.append(next_rid)
                    req.history = seq[-(width - 1):]
                else:
                    resets.append(slot)
                positions[b] = req
                next_rid += 1
        prefill = None
        if p_slots:
            prefill = Prefill(
                query_start_loc=np.asarray(p_qsl, dtype=np.int32), slots=np.asarray(p_slots, dtype=np.int32),
                tokens=np.asarray(p_tokens, dtype=np.intp), rows=np.arange(len(p_tokens)),
                windows=np.asarray(p_windows, dtype=np.intp).reshape(len(p_tokens), width),
                pad_rows=np.zeros(0, dtype=np.intp), request_ids=np.asarray(p_rids, dtype=np.int64))
        qsl = [0]
        slots, num_acc, tokens, rows, windows, pad_rows, rids, accepted = [], [], [], [], [], [], [], []
        for b in range(batch):
            req = positions[b]
            start = qsl[-1]
            if req is None:                           # empty position: pad entry
                wait[b] -= 1
                n = int(rng.integers(0, drafts + 2))
                tokens.extend(rng.integers(0, pool_size, size=n).tolist())
                pad_rows.extend(range(start, start + n))
                qsl.append(start + n)
                slots.append(PAD_SLOT_ID)
                num_acc.append(1)
                rids.append(-1)
                accepted.append(0)
                continue
            n = 1 + int(rng.integers(0, drafts + 1))  # verified token + k drafts
            fed = rng.integers(0, pool_size, size=n).tolist()
            seq = req.history + fed                   # accepted history, then this step's tokens
            windows.extend(seq[t:t + width] for t in range(n))
            rows.extend(range(start, start + n))
            tokens.extend(fed)
            qsl.append(start + n)
            slots.append(req.slot)
            num_acc.append(req.num_accepted)
            rids.append(req.rid)
            a = 1                                     # the verified token is always accepted
            while a < n and rng.random() < accept_rate:
                a += 1
            accepted.append(a)
            req.history = (req.history + fed[:a])[-(width - 1):]
            req.num_accepted = a
            req.steps_left -= 1
            if req.steps_left <= 0:                   # finished: free the slot
                free.append(req.slot)
                positions[b] = None
                wait[b] = int(rng.geometric(0.5)) - 1
        schedule.append(Step(
            query_start_loc=np.asarray(qsl, dtype=np.int32),
            slots=np.asarray(slots, dtype=np.int32),
            num_accepted=np.asarray(num_acc, dtype=np.int32),
            tokens=np.asarray(tokens, dtype=np.intp),
            resets=np.asarray(resets, dtype=np.intp),
            rows=np.asarray(rows, dtype=np.intp),
            windows=np.asarray(windows, dtype=np.intp).reshape(len(rows), width),
            pad_rows=np.asarray(pad_rows, dtype=np.intp),
            request_ids=np.asarray(rids, dtype=np.int64),
            accepted=np.asarray(accepted, dtype=np.int32),
            live_tokens=len(rows),
            prefill=prefill,
        ))
    return schedule


def make_model(rng, dim, width, dtype, pool_size):
    """Random weights, bias and token pool in ``dtype``, plus float64 copies of the
    rounded values (the pool gets an extra all-zero row for pre-start history)."""
    weight = (rng.standard_normal((dim, width)) / math.sqrt(width)).astype(dtype)
    bias = (0.1 * rng.standard_normal(dim)).astype(dtype)
    pool = rng.standard_normal((pool_size, dim), dtype=np.float32).astype(dtype)
    pool64 = np.zeros((pool_size + 1, dim))
    pool64[:pool_size] = pool
    return weight, bias, pool, pool64


# ---------------------------------------------------------------------------- checking

class Checker:
    """Compares a step's outputs with the float64 ground truth of the reference formula,
    ``silu(bias + sum_k weight[:, k] * window[k])`` over each request's own accepted
    history, in units of the accepted tolerance (``gdnconv.testing.error_ratio``;
    1.0 = at the limit).
    """

    def __init__(self, weight, bias, pool64, dtype):
        self.wT = np.ascontiguousarray(np.asarray(weight, dtype=np.float64).T)   # (W, D)
        self.b = np.asarray(bias, dtype=np.float64)
        self.pool64 = pool64
        self.dtype = dtype
        self.max_ratio = 0.0
        self.max_abs = 0.0
        self.worst = None          # where max_ratio was seen
        self.outputs = 0
        self.pad_violations = 0
        self.steps = 0

    def reference(self, windows):
        """(ref, magnitude) for outputs whose windows are pool rows ``windows`` (n, W)."""
        pre = np.broadcast_to(self.b, (len(windows), len(self.b))).copy()
        mag = np.broadcast_to(np.abs(self.b), pre.shape).copy()
        for k in range(windows.shape[1]):
            term = self.wT[k] * self.pool64[windows[:, k]]
            pre += term
            mag += np.abs(term)
        return silu(pre), mag

    def check(self, index, step, out):
        """Check every live output of step ``index`` (``out`` is the kernel's (N, D)
        output) and that pad entries' rows were left alone (still NaN)."""
        self.steps += 1
        if len(step.pad_rows):
            self.pad_violations += int(np.count_nonzero(~np.isnan(out[step.pad_rows].astype(np.float32))))
        if not len(step.rows):
            return
        ref, mag = self.reference(step.windows)
        got = out[step.rows].astype(np.float64)
        err = np.abs(got - ref)
        ratio = error_ratio(out[step.rows], ref, mag, self.dtype, silu=True)
        self.outputs += ratio.size
        j = int(np.argmax(ratio))
        if ratio.flat[j] > self.max_ratio or self.worst is None:
            r, d = divmod(j, ratio.shape[1])
            row = int(step.rows[r])
            pos = int(np.searchsorted(step.query_start_loc, row, side="right")) - 1
            self.max_ratio = float(ratio.flat[j])
            self.worst = {"step": index, "position": pos, "request": int(step.request_ids[pos]),
                          "slot": int(step.slots[pos]), "token": row - int(step.query_start_loc[pos]),
                          "channel": d, "got": float(got[r, d]), "want": float(ref[r, d])}
        self.max_abs = max(self.max_abs, float(np.max(np.where(np.isnan(err), np.inf, err))))

    @property
    def ok(self):
        return self.max_ratio <= 1.0 and self.pad_violations == 0

"""What ``gdnconv simulate`` and the benchmarks (``benchmarks/``) share to time honestly
on a real, often shared, machine: the size of the last-level cache (the benchmarks
rotate through enough layers' arrays to make every call cold, as it is in a served
model, where the other layers run between two calls of one layer), and a meter of the
CPU time other processes take meanwhile (on a small machine a busy neighbour makes
multi-threaded calls wait for the scheduler and ruins a timing).
"""
import glob
import os
import time

__all__ = ["last_level_cache_bytes", "CpuMeter", "wait_quiet", "BUSY_PCT", "busy_note", "busy_warning"]

BUSY_PCT = 20.0          # other processes above this % of one CPU: the timing is not trustworthy
_FALLBACK_LLC = 32 << 20


def _parse_size(text):
    """'36608K' / '2M' / '1024' (bytes) -> bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def last_level_cache_bytes():
    """The largest data or unified CPU cache of this machine in bytes (Linux sysfs,
    ``/sys/devices/system/cpu/cpu*/cache/index*``); 32 MiB where that cannot be read."""
    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "size")) as f:
                best = max(best, _parse_size(f.read()))
        except (OSError, ValueError):
            continue
    return best or _FALLBACK_LLC


class CpuMeter:
    """CPU time other processes used between two marks (Linux ``/proc/stat``), in percent
    of one CPU. ``ok`` is False where it cannot be read; ``others_pct`` is then NaN."""

    def __init__(self):
        try:
            self._tick = os.sysconf("SC_CLK_TCK")
            self._read_busy()
            self.ok = True
        except (OSError, ValueError, AttributeError, IndexError):
            self.ok = False

    def _read_busy(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]   # user nice system idle iowait irq softirq steal
        return (sum(v) - v[3] - v[4]) / self._tick

    def mark(self):
        """A point in time to measure from or to (None where unsupported)."""
        if not self.ok:
            return None
        t = os.times()
        return self._read_busy(), t.user + t.system, time.perf_counter()

    def others_pct(self, a, b):
        """CPU time of other processes between marks ``a`` and ``b``, % of one CPU."""
        if a is None or b is None or b[2] <= a[2]:
            return float("nan")
        return max(0.0, (b[0] - a[0]) - (b[1] - a[1])) / (b[2] - a[2]) * 100.0


def wait_quiet(max_s, threshold=15.0, window_s=0.25):
    """Wait (up to ``max_s`` seconds) until other processes use less than ``threshold``
    % of a CPU; returns the last share seen (NaN when not measured)."""
    meter = CpuMeter()
    if not meter.ok or max_s <= 0:
        return float("nan")
    end = time.perf_counter() + max_s
    while True:
        a = meter.mark()
        time.sleep(window_s)
        pct = meter.others_pct(a, meter.mark())
        if pct < threshold or time.perf_counter() >= end:
            return pct


def busy_note(pct):
    """' [other processes: 150% of a CPU]' for a result timed while other processes used
    more than BUSY_PCT % of a CPU, else ''."""
    if pct is None or not pct > BUSY_PCT:
        return ""
    return f" [other processes: {pct:.0f}% of a CPU]"


def busy_warning(pct):
    """The report's closing line when other processes used ``pct`` % of a CPU meanwhile."""
    return (f"WARNING: other processes used up to {pct:.0f}% of a CPU while this ran; the timings and the "
            f"speed-up are not trustworthy (run again on a quiet machine)")

"""The CPU as the CPU backend's ``Device``: cores from the affinity mask and the cgroup
quota, ATen's intra-op threads, the run-queue probe (``schedstat``) and the hypervisor's
stolen time (``/proc/stat``) that ``tune.timing`` reads.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from aotpack.backends.base import Device

#: The cgroup v2 CPU quota (``<quota> <period>`` or ``max <period>``).
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
#: The kernel's CPU counters; the ``cpu`` line's 8th value is the stolen time.
PROC_STAT = "/proc/stat"


def available_cores() -> int:
    """Cores this process may use: the affinity mask bounded by the cgroup CPU quota (>= 1)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


class RunDelayProbe:
    """Nanoseconds this process's threads have waited on the run queue (monotonic).

    Reads field 2 (``run_delay``) of ``/proc/self/task/<tid>/schedstat`` for the threads
    present at ``open`` (the OpenMP pool exists after the warm-up launches), through
    open descriptors (~1.5 us a read). Without schedstat (not Linux, or a kernel without
    ``CONFIG_SCHED_INFO``) it falls back to wall time minus this thread's CPU time:
    blind to a late OpenMP worker, but it still sees the launching thread preempted.
    """

    def __init__(self):
        self._fds: list[int] = []
        self._fallback = False

    def open(self) -> None:
        """(Re)open the schedstat of every current thread."""
        self.close()
        try:
            for tid in os.listdir("/proc/self/task"):
                self._fds.append(os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY))
            self.read()
        except (OSError, ValueError, IndexError):
            self.close()
            self._fallback = True

    def read(self) -> int:
        """Total run-queue wait so far (ns)."""
        if self._fallback:
            return time.perf_counter_ns() - time.thread_time_ns()
        total = 0
        for fd in self._fds:
            try:
                total += int(os.pread(fd, 128, 0).split()[1])
            except OSError:  # the thread ended
                pass
        return total

    def close(self) -> None:
        """Release the descriptors."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class CpuDevice(Device):
    """This machine's CPU: host tensors, synchronous calls, OpenMP threads."""

    def compute_units(self) -> int:
        """``available_cores()``."""
        return available_cores()

    @contextlib.contextmanager
    def extern_parallelism(self, units: int) -> Iterator[None]:
        """ATen's intra-op threads set to ``units`` inside the block, restored after.

        PGO times an extern implementation (ATen, MKL, oneDNN) against aotpack's kernels, which
        launch at most ``device_limit`` threads; the extern call runs with ATen's thread count,
        the machine's cores by default. Timed with 2 threads for a ``--device-limit 1`` build,
        MKL's 32x2048x512 linear took 617 us where it runs 870 us at 1 thread, and won over
        the GEMM template's 806 us. aotpack-run sets the same count (``--device-limit``).
        """
        before = torch.get_num_threads()
        torch.set_num_threads(units)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def run_delay_probe(self) -> RunDelayProbe:
        """``RunDelayProbe``: schedstat's run_delay of every thread."""
        return RunDelayProbe()

    def steal_ticks(self) -> int:
        """Clock ticks (USER_HZ) the hypervisor has stolen from this machine's CPUs so far:
        the 8th value of the ``cpu`` line of ``/proc/stat``; 0 where it is unreadable."""
        try:
            with open(PROC_STAT, encoding="ascii") as stat:
                return int(stat.readline().split()[8])
        except (OSError, ValueError, IndexError):
            return 0

    def clock_ticks_per_s(self) -> int:
        """USER_HZ, the unit of ``/proc/stat`` (100 where sysconf does not say)."""
        try:
            return os.sysconf("SC_CLK_TCK")
        except (ValueError, OSError, AttributeError):
            return 100

    def tuning_key(self, device_limit: int) -> tuple:
        """``(device_limit, ATen's intra-op threads)``: an extern call's time depends on both."""
        return (str(device_limit), str(torch.get_num_threads()))

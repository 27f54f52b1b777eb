#!/usr/bin/env python3
"""What a large background file costs a small commit's fdatasync.

Measures the latency of a 200-byte append + fdatasync (what a commit does)
every 4 ms for 9 s, while another thread writes or deletes eight 73 MiB
files (the size of a million-file checkpoint) in one of these ways:

  write-full      written at full speed, one fsync at the end
  write-paced     written at 32 MiB/s into a new file, fdatasync every
                  2 MiB (durable::write_atomic_paced without a file to reuse)
  write-direct    written at 32 MiB/s with O_DIRECT into a file
                  fallocated first (no page cache), fdatasync every 2 MiB
  write-recycle   like write-paced, but into an existing file of that size
                  overwritten in place, so no blocks are allocated or freed
                  (what checkpoints do: the pruned one is reused)
  none            nothing in the background (the disk's own flush time)
  delete-unlink   unlinked at once
  delete-steps    cut from the end 4 MiB at a time, 20 ms apart, then
                  unlinked (durable::remove_in_steps)

Prints p50, p99 and max of the flush latency and the total time flushes
spent above 20 ms (a stall of S ms delays every commit in it, so this is
what moves a lag p99). A MODE ending in "+idle" runs the background
thread in the idle I/O priority class (ioprio_set), e.g. write-paced+idle.
Usage: flush-latency.py MODE [DIR] (DIR default
/var/tmp; it must be on the disk the state folder uses). Used for
docs/BENCHMARKS.md "Checkpoints and restart".
"""
import ctypes
import mmap
import os
import sys
import threading
import time

MIB = 1 << 20
FILE_MIB = 73
FILES = 8
SYS_IOPRIO_SET = 251  # x86_64
IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_IDLE = 3


def idle_io():
    """Puts the calling thread in the idle I/O priority class."""
    libc = ctypes.CDLL(None, use_errno=True)
    tid = threading.get_native_id()
    if libc.syscall(SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")


def main():
    mode = sys.argv[1]
    idle = mode.endswith("+idle")
    mode = mode.removesuffix("+idle")
    root = sys.argv[2] if len(sys.argv) > 2 else "/var/tmp"
    d = os.path.join(root, "stagefs-flush-latency.%d" % os.getpid())
    os.makedirs(d)
    buf = os.urandom(MIB)
    aligned = mmap.mmap(-1, MIB)  # page-aligned, as O_DIRECT needs
    aligned.write(buf)
    try:
        if mode.startswith("delete") or mode == "write-recycle":
            for k in range(FILES):
                fd = os.open("%s/big%d" % (d, k), os.O_WRONLY | os.O_CREAT)
                for _ in range(FILE_MIB):
                    os.write(fd, buf)
                os.fsync(fd)
                os.close(fd)
            os.sync()
            time.sleep(2)
        stop = threading.Event()

        def background():
            if idle:
                idle_io()
            for k in range(FILES):
                if stop.is_set():
                    return
                p = "%s/big%d" % (d, k)
                if mode.startswith("write"):
                    direct = os.O_DIRECT if mode == "write-direct" else 0
                    trunc = 0 if mode == "write-recycle" else os.O_TRUNC
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | trunc | direct)
                    if direct:
                        os.posix_fallocate(fd, 0, FILE_MIB * MIB)
                    t0 = time.time()
                    for i in range(FILE_MIB):
                        os.write(fd, aligned if direct else buf)
                        if mode in ("write-paced", "write-direct", "write-recycle"):
                            if i % 2 == 1:
                                os.fdatasync(fd)
                            dt = t0 + (i + 1) / 32 - time.time()
                            if dt > 0:
                                time.sleep(dt)
                    os.fsync(fd)
                    os.close(fd)
                elif mode == "none":
                    pass
                elif mode == "delete-unlink":
                    os.unlink(p)
                elif mode == "delete-steps":
                    fd = os.open(p, os.O_WRONLY)
                    size = FILE_MIB * MIB
                    while size > 4 * MIB:
                        size -= 4 * MIB
                        os.ftruncate(fd, size)
                        time.sleep(0.02)
                    os.close(fd)
                    os.unlink(p)
                else:
                    raise SystemExit("unknown mode " + mode)
                time.sleep(0.8)

        log = os.open(d + "/log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        th = threading.Thread(target=background)
        th.start()
        lat = []
        end = time.time() + 9
        while time.time() < end:
            t = time.perf_counter()
            os.write(log, b"x" * 200)
            os.fdatasync(log)
            lat.append(time.perf_counter() - t)
            time.sleep(0.004)
        stop.set()
        th.join()
        os.close(log)
    finally:
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    lat.sort()
    stalled = sum(x for x in lat if x > 0.02)
    print(
        "%-19s flushes %d: p50 %.2f ms, p99 %.2f ms, max %.2f ms; above 20 ms for %.0f ms in all"
        % (mode + ("+idle" if idle else ""), len(lat), lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3, lat[-1] * 1e3, stalled * 1e3)
    )


if __name__ == "__main__":
    main()

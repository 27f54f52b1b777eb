#!/usr/bin/env python3
"""What a large background file costs a small commit's fdatasync.

Measures the latency of a 200-byte append + fdatasync (what a commit does)
every 4 ms for 9 s, while another thread writes or deletes eight 73 MiB
files (the size of a million-file checkpoint) in one of these ways:

  write-full      written at full speed, one fsync at the end
  write-paced     written at 32 MiB/s, fdatasync every 2 MiB (what
                  durable::write_atomic_paced does for checkpoints)
  delete-unlink   unlinked at once
  delete-steps    cut from the end 4 MiB at a time, 20 ms apart, then
                  unlinked (durable::remove_in_steps)

Prints p50, p99 and max of the flush latency and the total time flushes
spent above 20 ms (a stall of S ms delays every commit in it, so this is
what moves a lag p99). Usage: flush-latency.py MODE [DIR] (DIR default
/var/tmp; it must be on the disk the state folder uses). Used for
docs/benchmarks/HISTORY.md "Checkpoints and restart".
"""
import os
import sys
import threading
import time

MIB = 1 << 20
FILE_MIB = 73
FILES = 8


def main():
    mode = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) > 2 else "/var/tmp"
    d = os.path.join(root, "stagefs-flush-latency.%d" % os.getpid())
    os.makedirs(d)
    buf = os.urandom(MIB)
    try:
        if mode.startswith("delete"):
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
            for k in range(FILES):
                if stop.is_set():
                    return
                p = "%s/big%d" % (d, k)
                if mode.startswith("write"):
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    t0 = time.time()
                    for i in range(FILE_MIB):
                        os.write(fd, buf)
                        if mode == "write-paced":
                            if i % 2 == 1:
                                os.fdatasync(fd)
                            dt = t0 + (i + 1) / 32 - time.time()
                            if dt > 0:
                                time.sleep(dt)
                    os.fsync(fd)
                    os.close(fd)
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
        "%-14s flushes %d: p50 %.2f ms, p99 %.2f ms, max %.2f ms; above 20 ms for %.0f ms in all"
        % (mode, len(lat), lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3, lat[-1] * 1e3, stalled * 1e3)
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reader host reads (docs/BENCHMARKS.md, "Reader hosts"): a 1 GiB file
published to file://, read through `stagefs mount --from`.

Measures, in one run:
- cold read of the file through a fresh reader host vs reading the same
  published objects (its pieces) straight from the storage folder;
- first byte of the file on a fresh reader host vs one piece's read;
- warm read (cached) vs the same bytes on native disk.

    STAGEFS=target/release/stagefs scripts/bench/reader.py WORKDIR

Page caches are dropped before each cold measurement when run as root.
"""
import hashlib, json, os, subprocess, sys, time

BIN = os.environ.get("STAGEFS", "target/release/stagefs")
SIZE = int(os.environ.get("SIZE_MIB", "1024")) << 20
work = os.path.abspath(sys.argv[1])
src, events, pub = (os.path.join(work, d) for d in ("src", "events", "pub"))
for d in (src, events):
    os.makedirs(d, exist_ok=True)


def drop_caches():
    if os.geteuid() == 0:
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def read_all(path, bs=1 << 20):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(bs)
            if not b:
                return n
            n += len(b)


data_path = os.path.join(src, "big")
publisher = None
if not os.path.exists(data_path):
    h = hashlib.sha256()
    with open(data_path, "wb") as f, open("/dev/urandom", "rb") as r:
        left = SIZE
        while left:
            b = r.read(min(left, 8 << 20))
            h.update(b)
            f.write(b)
            left -= len(b)
    sha = h.hexdigest()
    lines = [
        {"id": 1, "op": "create_database", "db": "db"},
        {"id": 2, "op": "create_table", "db": "db", "table": "t"},
        {"id": 3, "op": "add_files", "db": "db", "table": "t",
         "files": [{"path": "big", "size": SIZE, "sha256": sha}]},
    ]
    with open(os.path.join(events, "log-1.jsonl"), "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    publisher = subprocess.Popen([BIN, "replicate", "--state", os.path.join(work, "state"),
                          "--source-root", src, "--events", events,
                          "--publish", "file://" + pub], stderr=subprocess.DEVNULL)
    want = SIZE // (8 << 20)
    while len(os.listdir(os.path.join(pub, "blobs")) if os.path.isdir(os.path.join(pub, "blobs")) else []) < want:
        time.sleep(0.2)
    # The publisher keeps running until the end: the reader hosts wait
    # for the file's state to be published.

pieces = sorted(os.path.join(pub, "blobs", n) for n in os.listdir(os.path.join(pub, "blobs")))


def mount(name):
    mnt, cache = os.path.join(work, name, "mnt"), os.path.join(work, name, "cache")
    subprocess.run(["rm", "-rf", os.path.join(work, name)])
    os.makedirs(mnt)
    p = subprocess.Popen([BIN, "mount", mnt, "--from", "file://" + pub, "--cache", cache,
                          "--cache-size", "4G", "--poll-ms", "200"], stderr=subprocess.DEVNULL)
    f = os.path.join(mnt, "db", "t", "big")
    while not os.path.exists(f):
        time.sleep(0.05)
    return p, mnt, f


def umount(p, mnt):
    p.terminate()
    p.wait()


rows = []
# Straight from storage: every piece object, in order.
drop_caches()
t = time.monotonic()
n = sum(read_all(x) for x in pieces)
direct = time.monotonic() - t
drop_caches()
t = time.monotonic()
read_all(pieces[0])
one_piece = time.monotonic() - t

drop_caches()
p, mnt, f = mount("cold")
t = time.monotonic()
m = read_all(f)
cold = time.monotonic() - t
assert m == SIZE, m
# Warm: once the filled file is in the cache's blobs/ (flushed and moved
# after its last piece), a new open reads it there (passthrough).
blobs = os.path.join(work, "cold", "cache", "blobs")
while not os.listdir(blobs):
    time.sleep(0.1)
read_all(f)
t = time.monotonic()
read_all(f)
warm = time.monotonic() - t
umount(p, mnt)

drop_caches()
p, mnt, f = mount("first")
t = time.monotonic()
with open(f, "rb", buffering=0) as fh:
    fh.read(1)
first = time.monotonic() - t
umount(p, mnt)

# Warm against native disk, both from the page cache after one read.
read_all(data_path)
t = time.monotonic()
read_all(data_path)
native = time.monotonic() - t

if publisher:
    publisher.terminate()
    publisher.wait()

mib = SIZE / (1 << 20)
print(f"load1 {os.getloadavg()[0]:.2f}  cpus {os.cpu_count()}  file {mib:.0f} MiB in {len(pieces)} pieces")
print(f"cold read via reader host   {cold:7.3f} s  {mib / cold:8.0f} MiB/s")
print(f"pieces straight from store  {direct:7.3f} s  {mib / direct:8.0f} MiB/s   ratio {direct / cold:.2f}x")
print(f"first byte (fresh host)     {first * 1000:7.1f} ms")
print(f"one piece read              {one_piece * 1000:7.1f} ms   ratio {first / one_piece:.1f}x")
print(f"warm read via reader host   {warm:7.3f} s  {mib / warm:8.0f} MiB/s")
print(f"native disk (page cache)    {native:7.3f} s  {mib / native:8.0f} MiB/s   ratio {native / warm:.2f}x")

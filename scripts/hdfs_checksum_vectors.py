#!/usr/bin/env python3
"""Test vectors for stagefs's HDFS checksum code (src/source/hive/checksum.rs),
computed independently of it: CRC32C from a bitwise-built table, CRC32 from
zlib, MD5 from hashlib, following Hadoop's FileChecksumHelper /
BlockChecksumHelper / DataOutputBuffer as described in checksum.rs.

Run:  python3 scripts/hdfs_checksum_vectors.py > tests/data/hdfs_checksums.json

Data of a vector is `lcg(size)`: x = 1; per byte x = (x*1103515245 + 12345)
mod 2^31, byte = (x >> 16) & 0xff. The algorithm itself is checked against
values published by JuiceFS's HDFS-compatible checksum tests (in
tests/hive_decode.rs), this script against the same values (--self-check).
"""
import hashlib
import json
import struct
import sys
import zlib


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_T = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc32(data):
    return zlib.crc32(data) & 0xFFFFFFFF


CRCS = {"CRC32C": crc32c, "CRC32": crc32}


def lcg(size):
    x = 1
    out = bytearray(size)
    for i in range(size):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out[i] = (x >> 16) & 0xFF
    return bytes(out)


def md5md5crc(data, bytes_per_crc, crc_per_block, crc):
    """hex of MD5MD5CRC32FileChecksum.getBytes()"""
    if not data:
        # FileChecksumHelper: no blocks -> MD5 of the empty 32-byte buffer.
        return struct.pack(">iq", 0, 0).hex() + hashlib.md5(b"\0" * 32).hexdigest()
    block = crc_per_block * bytes_per_crc if crc_per_block else len(data)
    block_md5s = b""
    for off in range(0, len(data), block):
        blk = data[off:off + block]
        crcs = b"".join(
            struct.pack(">I", crc(blk[i:i + bytes_per_crc]))
            for i in range(0, len(blk), bytes_per_crc)
        )
        block_md5s += hashlib.md5(crcs).digest()
    # MD5Hash.digest(DataOutputBuffer.getData()): the whole backing array,
    # 32 bytes doubling, zero-filled past the written block MD5s.
    capacity = 32
    while capacity < len(block_md5s):
        capacity *= 2
    padded = block_md5s + b"\0" * (capacity - len(block_md5s))
    return struct.pack(">iq", bytes_per_crc, crc_per_block).hex() + hashlib.md5(padded).hexdigest()


# (name, size, bytes_per_crc, crc_per_block); crc_per_block 0 = single block.
CASES = [
    ("empty", 0, 512, 0),
    ("one_block_short_last_chunk", 1000, 512, 0),
    ("one_block_whole_chunks", 1024, 512, 0),
    ("one_byte", 1, 512, 0),
    ("three_blocks_padded", 5000, 512, 4),
    ("two_blocks_aligned_unpadded", 4096, 512, 4),
    ("sixteen_blocks_exact_capacity", 1000, 16, 4),
    ("eighteen_blocks_padded", 1090, 16, 4),
    ("five_blocks_one_crc_each", 77, 16, 1),
]


def self_check():
    # JuiceFS JuiceFileSystemTest.testChecksum (HDFS-compatible checksums).
    assert md5md5crc(b"world\n", 512, 0, crc32c).endswith("a74dcf6d5ba98e50ae0182c9d5d886fe")
    assert md5md5crc(b"world", 512, 0, crc32c).endswith("05a157db1cc7549c82ec6f31f63fdb46")
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32(b"123456789") == 0xCBF43926


def main():
    self_check()
    vectors = []
    for name, size, bpc, cpb in CASES:
        data = lcg(size)
        for crc_name, fn in CRCS.items():
            vectors.append({
                "name": f"{name}_{crc_name.lower()}",
                "size": size,
                "bytes_per_crc": bpc,
                "crc_per_block": cpb,
                "crc": crc_name,
                "hex": md5md5crc(data, bpc, cpb, fn),
            })
    for size in (0, 1, 5000):
        data = lcg(size)
        for crc_name, fn in CRCS.items():
            vectors.append({
                "name": f"composite_{size}_{crc_name.lower()}",
                "size": size,
                "composite": True,
                "crc": crc_name,
                # An empty file has no blocks: Hadoop returns the MD5 form.
                "hex": "%08x" % fn(data) if data else md5md5crc(data, 512, 0, fn),
            })
    json.dump({"generator": "scripts/hdfs_checksum_vectors.py", "data": "lcg(size)",
               "vectors": vectors}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Seeds fuzz/corpus/hive_message/ from the rows in tests/data/: every real
metastore row (tests/data/hive-real/*.jsonl, mode 0), each message body
again as plain JSON for mode 2 (gzip bodies decompressed, so the fuzzer
mutates the JSON the target compresses again), and the sample messages
(tests/data/hive-samples/). Run from the repository root."""
import base64, gzip, hashlib, json, os, pathlib

TYPES = ["CREATE_DATABASE", "DROP_DATABASE", "CREATE_TABLE", "DROP_TABLE",
         "ALTER_TABLE", "ADD_PARTITION", "ALTER_PARTITION", "DROP_PARTITION",
         "ALTER_PARTITIONS", "INSERT", "COMMIT_TXN"]
out = pathlib.Path("fuzz/corpus/hive_message")
out.mkdir(parents=True, exist_ok=True)

def seed(data: bytes):
    (out / hashlib.sha1(data).hexdigest()).write_bytes(data)

def body_seed(event_type: str, gz: bool, body: bytes):
    if event_type in TYPES:
        selector = (TYPES.index(event_type) << 2) | (2 if gz else 1)
        seed(bytes([2, selector]) + body)

for f in sorted(pathlib.Path("tests/data/hive-real").glob("*.jsonl")):
    for line in f.read_text().splitlines():
        if not line.strip():
            continue
        seed(b"\x00" + line.encode())
        row = json.loads(line)
        msg, fmt = row.get("MESSAGE"), row.get("MESSAGE_FORMAT") or ""
        if msg is None:
            continue
        gz = fmt.startswith("gzip")
        body = gzip.decompress(base64.b64decode(msg)) if gz else msg.encode()
        body_seed(row["EVENT_TYPE"], gz, body)

for f in sorted(pathlib.Path("tests/data/hive-samples").glob("*.json")):
    text = f.read_bytes()
    if "txn_write_notification_log_row" in f.name:
        seed(b"\x01" + text)
        continue
    for t in TYPES:
        if t.lower() in f.name.lower():
            body_seed(t, False, text)
    seed(b"\x03" + text)

print(len(list(out.iterdir())), "seeds in", out)

"""A long-lived suite worker: `python -m parity.suites.worker`. Speaks length-prefixed pickles on
stdin/stdout (the pool owns both ends); its own prints go to stderr. Sends {"ready": ...} once
torch is imported, then one result per case until stdin closes. A kernel that kills this process
costs the pool one case (parity.suites.pool)."""

from __future__ import annotations

import os
import pickle
import struct
import sys

import torch

from parity.suites import execute


def read_msg(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    return pickle.loads(f.read(n))


def write_msg(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<I", len(data)) + data)
    f.flush()


def main() -> int:
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints from ops and libraries must not corrupt the protocol
    proto_in = sys.stdin.buffer
    threads = int(os.environ.get("PARITY_SUITE_THREADS", "1") or 0)

    if threads > 0:
        torch.set_num_threads(threads)

    write_msg(proto_out, {"ready": True, "pid": os.getpid()})
    while True:
        msg = read_msg(proto_in)
        if msg is None:
            break
        try:
            res = execute.run_case(msg["case"], msg["cell"])
        except Exception as e:  # a bug in the harness, not the op: still a result
            res = {"status": "INFER_FAIL", "reason": "harness: " + execute.reason_of(e)}
        write_msg(proto_out, res)
    proto_out.flush()
    os._exit(0)  # skip torch's interpreter teardown


if __name__ == "__main__":
    raise SystemExit(main())

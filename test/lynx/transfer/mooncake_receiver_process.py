"""A MooncakeListener run as a separate process by the Mooncake transport tests.

Prints ``{"endpoint": ...}`` as its first stdout line, then receives until
``--messages`` messages (``raw``) or every expected stream (``frames``)
arrived, or ``--idle-timeout-s`` passed without a message, and prints one
JSON line. ``raw``: the part lengths and sha256 of every message, in arrival
order. ``frames``: like ``receiver_process.py``, frames checked with
``decode_frame`` and reassembled, the errors by kind and each stream's sha256.
"""

import argparse
import hashlib
import json
import sys

from lynx.transfer.frames import FrameError, decode_frame
from lynx.transfer.mooncake.listener import MooncakeListener
from lynx.transfer.reassembly import RequestAssembly


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--key", required=True, help="shared secret, hex (control plane and frames)")
    parser.add_argument("--mode", choices=("raw", "frames"), required=True)
    parser.add_argument("--messages", type=int, default=0, help="raw: messages to receive")
    parser.add_argument("--expect", default="{}", help='frames: JSON {room: {stream: size}}')
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--slot-bytes", type=int, default=1 << 16)
    parser.add_argument("--idle-timeout-s", type=float, default=30.0)
    args = parser.parse_args()
    key = bytes.fromhex(args.key)
    expect = {int(room): {int(s): size for s, size in sizes.items()} for room, sizes in json.loads(args.expect).items()}
    assemblies = {room: RequestAssembly(room, sizes) for room, sizes in expect.items()}
    messages, errors, arrivals = [], [], []
    with MooncakeListener(key, slots=args.slots, slot_bytes=args.slot_bytes) as listener:
        print(json.dumps({"endpoint": listener.endpoint}), flush=True)
        while True:
            if args.mode == "raw" and len(messages) >= args.messages:
                break
            if args.mode == "frames" and all(a.ready(a.streams) for a in assemblies.values()):
                break
            parts = listener.recv(args.idle_timeout_s)
            if parts is None:
                break
            if args.mode == "raw":
                messages.append([[len(part) for part in parts], hashlib.sha256(b"".join(parts)).hexdigest()])
                continue
            try:
                header, payload = decode_frame(parts, key, args.slot_bytes)
                assemblies[header.room].accept(header, payload)
                arrivals.append([header.room, header.stream, header.chunk_index])
            except (FrameError, KeyError) as exc:
                errors.append(type(exc).__name__)
        stats = listener.stats()
    digests = {
        str(room): {str(s): hashlib.sha256(a.buffer(s)).hexdigest() for s in a.streams if a.is_complete(s)}
        for room, a in assemblies.items()
    }
    print(json.dumps({"messages": messages, "arrivals": arrivals, "errors": errors, "sha256": digests,
                      "rejected": stats.rejected}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

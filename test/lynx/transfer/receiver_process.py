"""A receiver run as a separate process by the transfer tests.

Prints ``{"endpoint": ...}`` as its first stdout line, then receives frames
until every expected stream is complete, ``--max-frames`` messages arrived,
or ``--idle-timeout-s`` passed without one, and prints one JSON line: the
arrival order of accepted frames, the errors by kind, and the sha256 of each
completed stream.
"""

import argparse
import hashlib
import json
import sys

from lynx.transfer.frames import FrameError, decode_frame
from lynx.transfer.reassembly import RequestAssembly
from lynx.transfer.zmq_transport import ZmqListener


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--key", default="", help="shared secret, hex")
    parser.add_argument("--max-payload", type=int, required=True, help="largest accepted payload, bytes")
    parser.add_argument("--expect", required=True, help='JSON {room: {stream: size}}')
    parser.add_argument("--max-frames", type=int, default=1 << 30)
    parser.add_argument("--idle-timeout-s", type=float, default=20.0)
    args = parser.parse_args()
    key = bytes.fromhex(args.key)
    expect = {int(room): {int(s): size for s, size in sizes.items()} for room, sizes in json.loads(args.expect).items()}
    assemblies = {room: RequestAssembly(room, sizes) for room, sizes in expect.items()}
    arrivals, errors, frames = [], [], 0
    with ZmqListener(max_message_bytes=args.max_payload + 64) as listener:
        print(json.dumps({"endpoint": listener.endpoint}), flush=True)
        while frames < args.max_frames and not all(
            assembly.ready(assembly.streams) for assembly in assemblies.values()
        ):
            parts = listener.recv(args.idle_timeout_s)
            if parts is None:
                break
            frames += 1
            try:
                header, payload = decode_frame(parts, key, args.max_payload)
                assembly = assemblies.get(header.room)
                if assembly is None:
                    errors.append("UnknownRoom")
                    continue
                assembly.accept(header, payload)
            except FrameError as exc:
                errors.append(type(exc).__name__)
                continue
            arrivals.append([header.room, header.stream, header.chunk_index])
    digests = {
        str(room): {
            str(stream): hashlib.sha256(assembly.buffer(stream)).hexdigest()
            for stream in assembly.streams
            if assembly.is_complete(stream)
        }
        for room, assembly in assemblies.items()
    }
    print(json.dumps({"arrivals": arrivals, "errors": errors, "sha256": digests}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

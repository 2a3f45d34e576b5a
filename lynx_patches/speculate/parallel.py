"""Parallel sampling (``n > 1``) through a prefill/decode pair: one transfer room per sample.

SGLang's tokenizer manager serves ``n > 1`` by sending the prompt once with
``max_new_tokens = 0`` (to cache its prefix), then ``n`` copies of the
request, all with the request's one ``bootstrap_room``. A PD backend keys each
transfer by that room (SGLang's own Mooncake backend keys `transfer_infos`
by it too), so the copies collide: Lynx refuses the second live request with
a room, and the client gets an error.

Both servers of a pair receive the same request and send its parts in the
same order (the prefix request first and awaited, then the samples in
turn), so each can number the parts of a room alike. `SampleRooms` gives the
k-th part of an ``n > 1`` request (k = 0 is the prefix request) its own room,
derived from the request's room and k, identically on both servers.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from lynx_patches.startup import lynx_config_of

ATTR = "_lynx_sample_rooms"
MAX_TRACKED = 4096  # parts of rooms whose later parts never came (a failed prefix request)


def sample_room(room: int, part: int) -> int:
    """The transfer room of part `part` of a parallel-sampling request with room `room`."""
    if part == 0:
        return room
    digest = hashlib.blake2b(f"lynx-sample:{room}:{part}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1


class SampleRooms:
    """Counts the parts of each parallel-sampling room seen by one tokenizer manager."""

    def __init__(self) -> None:
        self._parts: OrderedDict[int, int] = OrderedDict()

    def assign(self, room: int, n: int) -> int:
        """The room for the next part of a request with room `room` and `n` samples."""
        part = self._parts.pop(room, 0)
        if part < n:  # parts 0 .. n: the prefix request and the n samples
            self._parts[room] = part + 1
            while len(self._parts) > MAX_TRACKED:
                self._parts.popitem(last=False)
        return sample_room(room, part)


def send_one_request(manager, tokenized_obj, *args, **kwargs):
    """BEFORE `TokenizerManager._send_one_request`: distinct rooms for the parts of an ``n > 1`` request."""
    params = getattr(tokenized_obj, "sampling_params", None)
    room = getattr(tokenized_obj, "bootstrap_room", None)
    if room is None or params is None or getattr(params, "n", 1) <= 1:
        return None
    if lynx_config_of(manager.server_args) is None:
        return None
    rooms = getattr(manager, ATTR, None)
    if rooms is None:
        rooms = SampleRooms()
        setattr(manager, ATTR, rooms)
    tokenized_obj.bootstrap_room = rooms.assign(int(room), params.n)
    return None

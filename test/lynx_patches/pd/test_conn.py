"""SGLang's sender for the lynx backend against a small fake of its side: what it claims it releases,
on every path SGLang ends a request by."""

from __future__ import annotations

from types import SimpleNamespace

from lynx_patches.pd.conn import LynxKVSender
from sglang.srt.disaggregation.base.conn import KVPoll

ROOM = 7


class _Side:
    """The `PrefillSide` calls a sender makes, recorded; `busy` says whether the encoder reads the room."""

    def __init__(self, busy: bool = False) -> None:
        self.busy_now, self.calls = busy, []

    def abort(self, room):
        self.calls.append(("abort", room))

    def busy(self, room):
        return self.busy_now

    def release(self, room):
        self.calls.append(("release", room))

    def wire_bytes(self, room):
        return 123


def _sender(side: _Side) -> LynxKVSender:
    """A claimed sender whose SGLang base records a failure as SGLang's does (no network)."""
    sender = LynxKVSender.__new__(LynxKVSender)
    statuses = {}
    sender.lynx_side, sender._lynx_owner, sender.bootstrap_room = side, True, ROOM
    sender.conclude_state, sender._owns_bootstrap_room = None, True
    sender.kv_mgr = SimpleNamespace(deferred_bootstrap=None, record_failure=lambda room, reason: None,
                                    update_status=statuses.__setitem__, request_status=statuses, check_status=statuses.get)  # fmt: skip
    sender.trace_ctx = SimpleNamespace(abort=lambda **kwargs: None, trace_req_finish=lambda: None)
    return sender


def test_an_abort_sglang_drops_without_clear_releases_the_room_at_once():
    """SGLang's waiting-queue abort calls only `abort` and drops the request: the room must not stay claimed."""
    side = _Side()
    _sender(side).abort()
    assert side.calls == [("abort", ROOM), ("release", ROOM)]


def test_an_abort_while_the_encoder_reads_the_pages_leaves_the_release_to_clear():
    side = _Side(busy=True)
    sender = _sender(side)
    sender.abort()
    assert side.calls == [("abort", ROOM)], "the encoder still reads the pages: the room stays"
    assert sender.poll() == KVPoll.Transferring
    side.busy_now = False
    assert sender.poll() == KVPoll.Failed
    assert side.calls == [("abort", ROOM)], "released by `clear`, which SGLang's failure path calls"


def test_a_sender_that_lost_its_claim_never_releases_the_room_of_the_request_that_holds_it():
    side = _Side()
    sender = _sender(side)
    sender._lynx_owner = False
    sender.abort()
    assert side.calls == []

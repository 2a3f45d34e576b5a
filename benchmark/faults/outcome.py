"""One fault's outcome from bench_serving's per-request records: answered, failed (with the reason a
client read), hung, and every answer judged against `int8` decoding of the same prompt."""

from __future__ import annotations

from lynx_testing.judge import Answer, Tally

from load.judging import answers, judge_requests

ANSWERED = ("length", "stop")


def answered(record: dict) -> bool:
    """Completed with all its tokens: a stream that ended on an abort is a failure, not an answer."""
    return bool(record.get("success")) and (record.get("finish_reason") or {}).get("type") in ANSWERED


def reason(record: dict) -> str:
    """What the client was told: the server's abort message, the stream's error event, or the last
    line of the client's own error (a connection refused while the router is down)."""
    finish = record.get("finish_reason") or {}
    if finish.get("type") == "abort":
        return cause(str(finish.get("message") or "aborted"))
    error = (record.get("error") or "").strip()
    if error.startswith("the stream carried"):
        return error.split("; ", 1)[0]
    return error.splitlines()[-1] if error else ""


def cause(message: str) -> str:
    """SGLang's "Decode transfer failed for request ... with exception KVTransferError(...): CAUSE" as CAUSE."""
    marker = message.find(" with exception ")
    if marker >= 0 and "): " in message[marker:]:
        return message[marker:].split("): ", 1)[1]
    return message


def clear(text: str) -> bool:
    return bool(text) and "Traceback" not in text


def outcome(records: list[dict], sent: int, fault_wall: float | None, judge) -> dict:
    """Counts of one fault's bench_serving requests (`sent` of them; `records` those that ended)."""
    done = [r for r in records if answered(r)]
    failed = [r for r in records if not answered(r)]
    reasons = [reason(r) for r in failed]
    tally: Tally = judge(done)
    ended_after_fault = [r["started_wall"] + (r.get("latency_s") or 0.0) - fault_wall for r in failed
                         if fault_wall is not None and r.get("started_wall")]  # fmt: skip
    return {
        "requests": sent,
        "answered": len(done),
        "drafted": sum(1 for r in done if ((r.get("lynx") or {}).get("speculative_tokens") or 0) > 0),
        "failed": len(failed),
        "unclear_errors": sum(1 for text in reasons if not clear(text)),
        "hung": sent - len(records),
        "judged": {k: v for k, v in tally.as_dict().items() if k != "failed_requests"},
        "wrong": tally.wrong + tally.unmatched,
        "last_failure_after_fault_s": round(max(ended_after_fault), 1) if ended_after_fault else None,
        "reasons": sorted(set(text[:240] for text in reasons)),
    }


class Judge:
    """Answers judged against the reference server's (`int8` decoding, greedy, EOS ignored), which are
    asked once per prompt and kept: every fault of a run sends the same prompts."""

    def __init__(self, continue_reference, encode=None) -> None:
        self._continue, self._encode = continue_reference, encode
        self._references: dict[tuple, Answer] = {}

    def __call__(self, records: list[dict]) -> Tally:
        """bench_serving's records (the answered ones) judged; a text prompt (`generated-shared-prefix`)
        is tokenized by `encode`, as the server did."""
        return self.judge_answers(answers(records, encode=self._encode))

    def judge_answers(self, candidates: list[tuple[tuple, Answer]]) -> Tally:
        """Answers keyed by ``(prompt ids, asked length)`` judged."""
        for key, _ in candidates:
            if key not in self._references:
                prompt, length = key
                tokens, top2 = self._continue(list(prompt), length)
                self._references[key] = Answer(prompt, tuple(tokens), tuple(top2))
        return judge_requests(candidates, self._references, self._continue)

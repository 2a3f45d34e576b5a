"""A fault-under-load run's verdict per fault and its table (`fault_load.py --from-json`, `doc_tables.py`)."""

from __future__ import annotations

import doc_markdown as md
from faults.levels import MEMORY_SLACK
from faults.outcome import cause

# Faults that touch no server: every bench_serving request must be answered.
NO_SERVER_FAULT = ("none", "abort")


def passed(f: dict) -> bool:
    """0 wrong, 0 hung, only clear errors (none where no server was hit), nothing held, memory back, serving."""
    return (
        f["wrong"] == 0
        and f["hung"] == 0
        and f["unclear_errors"] == 0
        and (f["failed"] == 0 or f["fault"] not in NO_SERVER_FAULT)
        and f["slots_held"] == f["rows_held"] == f["rooms_held"] == 0
        and not f["unanswering"]
        and f["memory_ratio"] <= MEMORY_SLACK
        and f["serves_after"]
    )


def passed_deployment(d: dict, profile) -> bool:
    """Every fault ran and passed, and the soak (if asked) ran and passed; no error stopped it."""
    ran = [f["fault"] for f in d["faults"]]
    soaked = not profile.soak_minutes or d.get("soak", {}).get("passed", False)
    return "error" not in d and ran == list(profile.ordered_faults) and all(f["passed"] for f in d["faults"]) and soaked


# The table's columns: header, cell. Those marked quiet are left out when every row is 0 (said once instead).
COLUMNS = (
    ("deployment", None, False),
    ("fault", lambda f: _fault(f), False),
    ("answered (drafted)", lambda f: f"{f['answered']} of {f['requests']} ({f['drafted']})", False),
    ("failed", lambda f: f["failed"], False),
    ("wrong", lambda f: f["wrong"], True),
    ("hung", lambda f: f["hung"], True),
    ("unclear errors", lambda f: f["unclear_errors"], True),
    ("slots / rows / rooms held", lambda f: f"{f['slots_held']} / {f['rows_held']} / {f['rooms_held']}", True),
    ("memory", lambda f: f"x{f['memory_ratio']:.3f}", False),
    ("threads, fds", lambda f: f"{f['threads_delta']:+d}, {f['fds_delta']:+d}", False),
    ("serving again after", lambda f: _again(f), False),
)
QUIET_SENTENCE = "0 wrong, 0 hung, 0 unclear errors and 0 slots, request rows or Lynx rooms held in every row"


def markdown(result: dict) -> str:
    p = result["profile"]
    faults = [f for d in result["deployments"] for f in d["faults"]]
    quiet = all(cell(f) in (0, "0 / 0 / 0") for _, cell, q in COLUMNS if q for f in faults)
    columns = [(h, cell) for h, cell, q in COLUMNS if not (q and quiet)]
    verdicts = not all(f["passed"] for f in faults)  # a column only where some fault failed
    said = ([QUIET_SENTENCE] if quiet and faults else []) + (["every fault passed"] if faults and not verdicts else [])
    lines = [
        f"{result['date']}, commit {result['commit']}, {result['wall_s'] / 60:.0f} min: "
        f"{'per load (the baseline, then each soak round)' if p.get('soak_minutes') else 'per fault'} "
        f"{p['requests']} bench_serving requests ({p['input_tokens']} + {p['output_tokens']} tokens, Poisson "
        f"{p['rate']:g}/s) on a {p['link_gbps']:g} Gbit/s link, timeout {p['transfer_timeout_s']:g} s"
        + "".join(f"; {s}" for s in said) + ".",
        "",
        *md.head([h for h, _ in columns] + (["verdict"] if verdicts else [])),
    ]
    for d in result["deployments"]:
        name = f"{d['transport']}, {d['prefills']} prefill" + ("s" if d["prefills"] > 1 else "")
        for f in d["faults"]:
            cells = [name] + [str(cell(f)) for _, cell in columns[1:]] + (["pass" if f["passed"] else "FAIL"] if verdicts else [])
            lines.append(md.line(cells))
    for d in result["deployments"]:
        if "soak" in d:
            lines += ["", _soak_line(d)]
        if "error" in d:
            lines += ["", f"{d['transport']}, {d['prefills']} prefill(s) stopped early: {d['error'][:300]}"]
    return "\n".join(lines) + "\n"


def _fault(f: dict) -> str:
    """The fault's name and what it did: connections reset, seconds a killed server took to come back."""
    note = f.get("note") or {}
    if "connections_reset" in note:
        return f"{f['fault']} ({note['connections_reset']} reset)"
    if "restart_s" in note:
        return f"{f['fault']} (up again in {note['restart_s']:g} s)"
    if "stalled_s" in note:
        return f"{f['fault']} ({note['stalled_s']:g} s)"
    return f["fault"]


def _again(f: dict) -> str:
    """How long after the fault's recovery (and the idle wait) a request was answered exactly again."""
    seconds = f.get("serving_again_s")
    return f"{seconds:g} s" if seconds is not None else "never"


def _soak_line(d: dict) -> str:
    s = d["soak"]
    slope = s["rss_slope_mib_per_hour"]
    return (f"Soak ({d['transport']}, {d['prefills']} prefill{'s' if d['prefills'] > 1 else ''}): {s['rounds']} "
            f"round{'s' if s['rounds'] != 1 else ''} "
            f"in {s['minutes']:g} min, {s['requests']} requests: {s['answered']} answered, {s['failed']} failed, "
            f"{s['wrong']} wrong, {s['hung']} hung; {s['aborted']} client aborts beside them{_kinds(s)}; slots / rows / rooms "
            f"held {s['slots_held']} / {s['rows_held']} / {s['rooms_held']}; resident memory {s['rss_mib_first']:.0f} -> "
            f"{s['rss_mib_last']:.0f} MiB, " + (f"slope {slope} MiB/hour: " if slope is not None else "no slope (one round): ")
            + f"{'pass' if s['passed'] else 'FAIL'}.")  # fmt: skip


def _kinds(s: dict) -> str:
    """The soak's requests of other kinds (`mixed.py`), where it sent any."""
    k = s.get("other_kinds") or {}
    if not k.get("requests"):
        return ""
    return (f", and {k['requests']} requests of other kinds (penalties, logit bias, stop strings, grammars): "
            f"{k['answered']} answered ({k['drafted']} drafted), {k['wrong']} wrong in {k['tokens_judged']:,} tokens "
            f"judged, {k['near_ties']} near tie{'' if k['near_ties'] == 1 else 's'}")


def single_markdown(result: dict) -> str:
    """The single-request fault scenarios of `test_pd_failures.py` (its `LYNX_FAULT_RECORD` JSON)."""
    lines = [
        f"{result['date']}, commit {result['commit']}: a {result['link_gbps']:g} Gbit/s link, no-progress timeout "
        f"{result['timeout_s']:g} s, a {result['pool_tokens']:,}-slot decode pool.",
        "",
        "| fault | requests | answered (drafted) | client aborts | failed | wrong (tokens judged) | slots held |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        failed = f"{r['failed']}: " + "; ".join(f'"{_cell(cause(text))}"' for text in r["reasons"]) if r["failed"] else "0"
        lines.append(f"| {r['fault']} | {r['requests']} | {r['answered']} ({r['drafted']}) | {r['aborted']} | {failed} "
                     f"| {r['wrong']} ({r['tokens_judged']}) | {r['slots_held']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """`text` for a Markdown table cell: one line, no column bars."""
    return " ".join(text.split()).replace("|", "/")


def matrix_markdown(result: dict) -> str:
    """The docs' table of a run over several deployments: a row per fault, a column per deployment,
    each cell the requests answered (drafted) and what the fault did; memory, threads, descriptors
    and the time to serve again as their spans above the table (every value is in the JSON)."""
    p, deployments = result["profile"], result["deployments"]
    faults = [f for d in deployments for f in d["faults"]]
    kills = [f for f in faults if "restart_s" in (f.get("note") or {})]
    others = [f["serving_again_s"] for f in faults if f not in kills and f.get("serving_again_s") is not None]
    failing = [f for f in faults if not f["passed"]]
    lines = [
        f"{result['date']}, commit {result['commit']}, {result['wall_s'] / 60:.0f} min: per fault {p['requests']} "
        f"bench_serving requests ({p['input_tokens']} + {p['output_tokens']} tokens, Poisson {p['rate']:g}/s) on a "
        f"{p['link_gbps']:g} Gbit/s link, timeout {p['transfer_timeout_s']:g} s. Cells: requests answered "
        f"(drafted), the rest failed with a clear error. After every fault: memory "
        f"x{_span([f['memory_ratio'] for f in faults])} of idle, threads {_span([f['threads_delta'] for f in faults], 'd')}, "
        f"file descriptors {_span([f['fds_delta'] for f in faults], 'd')}; a request answered exactly again "
        f"{_span(others, 'g')} s after the recovery (a kill: in its cell)"
        + (f"; {QUIET_SENTENCE}; every fault passed." if not failing else f"; {len(failing)} fault(s) FAILED."),
        "",
        *md.head(["fault", *(_deployment(d) for d in deployments)]),
    ]
    for name in dict.fromkeys(f["fault"] for f in faults):
        row = [next((f for f in d["faults"] if f["fault"] == name), None) for d in deployments]
        stalled = {(f.get("note") or {}).get("stalled_s") for f in row if f}
        label = name + (f" ({stalled.pop():g} s)" if len(stalled) == 1 and None not in stalled else "")
        lines.append(md.line([label, *(_matrix_cell(f) for f in row)]))
    for d in deployments:
        if "error" in d:
            lines += ["", f"{_deployment(d)} stopped early: {d['error'][:300]}"]
    return "\n".join(lines) + "\n"


def _deployment(d: dict) -> str:
    return f"{d['transport']}, {d['prefills']} prefill" + ("s" if d["prefills"] > 1 else "")


def _span(values, spec: str = ".3f") -> str:
    values = list(values)
    if not values:
        return "-"
    sign = "+" if spec == "d" else ""
    low, high = (format(v, sign + spec) for v in (min(values), max(values)))
    return low if low == high else f"{low} to {high}" if spec == "d" else f"{low}-{high}"


def _matrix_cell(f: dict | None) -> str:
    if f is None:
        return "not run"
    note = f.get("note") or {}
    text = f"{f['answered']} ({f['drafted']})"
    if "connections_reset" in note:
        text += f", {note['connections_reset']} reset"
    if "restart_s" in note:
        text += f"; up in {note['restart_s']:g} s, serving {_again(f)} after"
    if not f["passed"]:
        text += (f"; FAIL: {f['wrong']} wrong, {f['hung']} hung, {f['unclear_errors']} unclear, held "
                 f"{f['slots_held']} / {f['rows_held']} / {f['rooms_held']}, memory x{f['memory_ratio']:.3f}")
    return text


def pd_soak_markdown(result: dict) -> str:
    """The bounded soak of `test_pd_soak.py` (its `soak-report.json`): one sentence per mode, then lynx's judging."""
    parts = []
    for run in result["runs"]:
        errors = md.count(len(run["errors"]), "error") if run["errors"] else "no error"
        cpu, rss = run["cpu_s_per_request"], run["rss_growth_mib"]
        parts.append(
            f"`{run['mode']}`: {run['answered']} of {run['requests']} answered and {run['aborted']} client aborts "
            f"in {run['seconds']:.0f} s, {errors}, {run['kv_slots_leaked']} slots and {run['rooms_left']} rooms "
            f"left, CPU per request {cpu['prefill']:.2f} s (prefill) and {cpu['decode']:.2f} s (decode), resident "
            f"memory +{rss['prefill']:.0f} and +{rss['decode']:.0f} MiB"
        )
    lines = [f"{result['date']}, commit {result['commit']}: " + "; ".join(parts) + "."]
    for run in result["runs"]:
        if "judged" in run:
            j = run["judged"]
            every = "All " if j["equal"] == j["answers"] else ""
            lines.append(f"{every}{j['equal']} of {j['answers']} `{run['mode']}` answers equal `int8`'s "
                         f"({j['tokens_judged']:,} tokens judged, {md.count(j['near_ties'], 'near tie')}, {j['wrong']} wrong).")  # fmt: skip
    delta = result.get("lynx_minus_int8_cpu_s_per_request")
    if delta:
        lines.append(f"`lynx` minus `int8` CPU per request: {delta['prefill']:+.3f} s on the prefill, "
                     f"{delta['decode']:+.3f} s on the decode.")  # fmt: skip
    return "\n".join(lines) + "\n"

"""One model's evaluation: every variant's PD pair in turn, and the held-out text scored alongside.

Per variant, one fresh deployment: first the speed rows (the prefill timed
alone, then streamed requests at every link rate), then the task items. The
teacher-forced scoring runs in this process on a background thread while
deployments start and answer task items, never during a timed phase: both
take `gate` (a lock) around each unit of work.

Where the plan allows it (`ModelPlan.early_start`), the next variant's pair,
or only its prefill server where two pairs do not fit in memory, starts while
this one answers its task items, which are not timed; it is ready, or waited
for, before its own speed rows. An early start that fails (memory taken by the
running pair) is retried the ordinary way once the running pair has stopped.
Each variant records the seconds its start, speed rows and items took, and
how long of its start was left to wait for.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from evaluation import accuracy, estimates, likelihood, speed
from evaluation.comparisons import Continuations, comparisons
from evaluation.deployments import deployment, http_ports, start
from evaluation.link import ShapedLoopback
from evaluation.plan import ModelPlan, Variant
from lynx_deploy.models import prepare
from lynx_testing.tasks import heldout_texts

KL_SEED = 14


class Background(threading.Thread):
    """Runs `fn` on a daemon thread; `result()` joins it and returns its value or re-raises its error."""

    def __init__(self, fn: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._fn, self._value, self._error = fn, None, None

    def run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self._error = exc

    def result(self):
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def units(plan: ModelPlan, variants: Sequence[Variant]) -> int:
    """Progress steps of one model: per variant a start, a calibration, the speed requests and the items; the windows."""
    per = [2 + len(plan.speed_ratios) * plan.speed_repeats + _item_count(plan, v) for v in variants]
    return sum(per) + plan.kl_windows


def _item_count(plan: ModelPlan, variant: Variant) -> int:
    return min(plan.stock_items, len(plan.items)) if variant.stock else len(plan.items)


def evaluate_model(plan: ModelPlan, variants: Sequence[Variant], out_dir: Path, link: ShapedLoopback,
                   progress, pending: list[EarlyStart], next_plan: ModelPlan | None = None) -> dict:  # fmt: skip
    """Run `plan` for every variant; returns every number (see `report.py` for the layout).

    `pending` holds the next variant's early start, from one variant to the next and from
    one model to the next: this model's first variant takes what it holds, and where
    `next_plan` follows (with early starts of its own) its first variant's prefill server
    starts while this model's last variant answers its task items. The caller discards
    what is left in it.
    """
    from transformers import AutoTokenizer

    model_path = prepare(plan.model, log=progress.write)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    items = [(spec, accuracy.build_item(tokenizer, spec)) for spec in plan.items]
    windows = heldout_texts(tokenizer, plan.kl_context, plan.kl_continuation, plan.kl_windows, seed=KL_SEED)
    gate = threading.Lock()

    def score():
        scorer = likelihood.TeacherForcing(model_path)
        return likelihood.score_windows(scorer, windows, list(likelihood.CODECS), progress.step, gate)

    scoring = Background(score)
    scoring.start()
    result = {"model": plan.model, "model_path_name": model_path.name, "variants": {}, "speed": [], "rates_gbps": None}
    rates: list[float] | None = None
    for index, variant in enumerate(variants):
        record = result["variants"].setdefault(variant.name, {})
        early = pending.pop() if pending else None
        # Evaluated once this variant's pair serves, so that nothing can fail between take and stop.
        choose_following = functools.partial(_following, plan, variants, index, model_path, out_dir, next_plan,
                                             progress.write)  # fmt: skip
        try:
            make = _maker(plan, variant, model_path, out_dir)
            rates = _run_variant(plan, variant, make, link, tokenizer, items, rates, gate, progress, record,
                                 result, early, choose_following, pending)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - one variant's failure is reported, the run goes on
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()
            progress.write(f"[{plan.model} {variant.name}] failed: {record['error'].splitlines()[0]}")
    result["rates_gbps"] = rates
    try:
        began = time.monotonic()
        per_window = scoring.result()
        result["scoring_wait_s"] = time.monotonic() - began
        result["likelihood"] = {"per_window": per_window, "summary": likelihood.summarize(per_window)}
    except Exception as exc:  # noqa: BLE001
        result["likelihood"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    progress.phase(f"{plan.model}: judging the items' tokens")
    with Continuations(plan, model_path, out_dir, progress.write) as continuations:
        result["comparisons"] = comparisons(result["variants"], continuations.url)
    _estimator_check(plan, result, progress)
    return result


def _estimator_check(plan: ModelPlan, result: dict, progress) -> None:
    """Codec rates on this model's KV shape, then the estimator against every measured speed row."""
    if not result["speed"]:
        return
    progress.phase(f"{plan.model}: codec rates and estimator check")
    tokens = result["speed"][0]["prompt_tokens"]
    rates = estimates.codec_rates(plan.geometry, tokens)
    calibrated = {name: v["prefill_s"] for name, v in result["variants"].items() if "prefill_s" in v}
    prefill_s = calibrated.get("bf16", next(iter(calibrated.values())))
    result["codec_rates"] = rates
    result["estimator_prefill_s"] = prefill_s
    result["estimator_check"] = estimates.check_rows(plan.geometry, result["speed"], prefill_s, rates)


class EarlyStart:
    """A pair (`part` ``pair``), or its prefill server (``prefill``), started while the
    previous variant answers its task items; `take` starts whatever is left.

    Its servers get SIGTERM when the thread that started them ends
    (`lynx_deploy.processes.die_with_parent`), so that thread lives until the
    pair is stopped (`release`).
    """

    def __init__(self, make: Callable[[], object], log, part: str = "pair") -> None:
        if part not in ("pair", "prefill"):
            raise ValueError(f"an early start is of a 'pair' or a 'prefill' server, not {part!r}")
        self.make, self._log, self.part = make, log, part
        self.pd = make()  # ports are chosen now, so the link can exempt them
        self._error: BaseException | None = None
        self._ready, self._released = threading.Event(), threading.Event()
        threading.Thread(target=self._own, daemon=True).start()

    def _own(self) -> None:
        try:
            if self.part == "pair":
                self.pd.start()
            else:
                self.pd.start_prefill()
        except BaseException as exc:  # noqa: BLE001 - handed to take()
            self._error = exc
            self.pd.stop()
        finally:
            self._ready.set()
        self._released.wait()

    def take(self):
        """The started pair (its decode server and router started now where only its prefill
        server started early), or (the early start having failed) one started now, the ordinary way."""
        self._ready.wait()
        if self._error is None and self.part == "prefill":
            try:
                self.pd.start()
            except Exception as exc:  # noqa: BLE001 - memory, most likely: start again below
                self._error = exc
                self.pd.stop()
        if self._error is None:
            return self.pd
        self._log(f"the early start failed ({type(self._error).__name__}: "
                  f"{str(self._error).splitlines()[0][:200]}); starting again")  # fmt: skip
        return start(self.make, log=self._log)

    def release(self) -> None:
        """Let the owning thread end: call once the pair has stopped."""
        self._released.set()

    def discard(self) -> None:
        """Stop a pair that no variant took."""
        self._ready.wait()
        if self._error is None:
            self.pd.stop()
        self.release()


def _following(plan, variants, index, model_path, out_dir, next_plan, log):
    """What to start early while variant `index` answers its items: ``(make, part)`` or None.

    The next variant of this model, as the plan allows; after the last one, the next
    model's first variant, its prefill server only (two models' pairs are not sized to
    fit side by side)."""
    if index + 1 < len(variants):
        if not plan.early_start:
            return None
        return _maker(plan, variants[index + 1], model_path, out_dir), plan.early_start
    if next_plan is None or not next_plan.early_start:
        return None
    return _maker(next_plan, variants[0], prepare(next_plan.model, log=log), out_dir), "prefill"


def _run_variant(plan, variant, make, link, tokenizer, items, rates, gate, progress, record, result, early,
                 choose_following, pending):  # fmt: skip
    progress.phase(f"{plan.model} {variant.name}: starting the PD pair")
    timings = record.setdefault("timings", {})
    began = time.monotonic()
    if early is not None:
        try:
            pd = early.take()
        except BaseException:
            early.release()
            raise
    else:
        pd = start(make, log=progress.write)
    timings["start_wait_s"] = time.monotonic() - began
    timings["early_start"] = early.part if early is not None and pd is early.pd else ""
    try:
        progress.step()
        began = time.monotonic()
        with gate:
            progress.phase(f"{plan.model} {variant.name}: speed")
            prefill_s = speed.calibrate(pd, tokenizer, plan.speed_tokens)
            record["prefill_s"] = prefill_s
            progress.step()
            if rates is None:
                rates = speed.rates_for(plan.geometry, plan.speed_tokens, prefill_s, plan.speed_ratios)
                result["reference_prefill_s"] = prefill_s
            result["speed"] += speed.run_speed(pd, link, plan, variant, tokenizer, rates, prefill_s,
                                               result["reference_prefill_s"], progress.step)  # fmt: skip
        timings["speed_s"] = time.monotonic() - began
        began = time.monotonic()
        progress.phase(f"{plan.model} {variant.name}: task items")
        exempt = http_ports(pd)
        following = choose_following()
        if following is not None:
            make_following, part = following
            following_pair = EarlyStart(make_following, progress.write, part)
            pending.append(following_pair)
            exempt += http_ports(following_pair.pd)
        chosen = items[: _item_count(plan, variant)]
        # A slow link in lynx modes, so that items are drafted on the anchor and verified.
        record["accuracy_link_gbps"] = min(rates) if variant.speculates else None
        if variant.speculates:
            link.set_rate(min(rates), exempt)
        try:
            record["items"] = accuracy.run_items(pd.url, chosen, progress.step, tokenizer.encode)
        finally:
            link.set_rate(None)
        record["summary"] = accuracy.summarize(record["items"])
        timings["items_s"] = time.monotonic() - began
    finally:
        pd.stop()
        if early is not None:
            early.release()
    return rates


def _maker(plan, variant, model_path, out_dir) -> Callable[[], object]:
    """Makes the (not yet started) pair of `variant` of `plan.model`, logging under `out_dir`."""
    return lambda: deployment(plan, variant, model_path, out_dir / "logs" / f"{plan.model}-{variant.name}")

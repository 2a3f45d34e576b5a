"""The whole evaluation: accuracy, likelihood, speed, the stock SGLang baseline and the estimator, in one run.

For each model (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct) and each
variant (`bf16`, `stock` SGLang Mooncake, `int8`, `int4`, `lynx`, `lynx-2+6`)
one real prefill/decode pair is started on this CPU, and:

* speed: the prefill is timed alone, then streamed requests run at three
  emulated link rates (interleaved), giving the time to the 1st, 8th and
  32nd token, the anchor and residual arrivals, acceptance and rollbacks;
* accuracy: long-context task items (needles, passkeys, multi-key needles,
  variable tracking) through the router, scored with `string_match_all`,
  with each output token's top-2 log-probabilities so that `lynx` can be
  compared with `int8` item for item;
* in the same process, teacher-forced log-likelihood and KL divergence of
  held-out Shakespeare text under each wire format's context KV;
* then the codec's rates on the model's KV, and the cluster-scale estimator
  checked against the measured rows.

Everything runs in a private network namespace with nothing but loopback
(Mooncake's engine listens on every interface): the script re-executes
itself under `python -m lynx_testing.netns`. The link is emulated by `tc` on
that loopback (see `evaluation/link.py`). Written to `--out`: `report.md`,
`results.json` (every number) and PNG plots; with `--doc-json`, also the
compact results docs/RESULTS.md's tables are rendered from
(`evaluation/compact.py`, `evaluation/doc_tables.py`).

    python benchmark/evaluate.py --out results/eval --doc-json docs/results/evaluation.json
    python benchmark/evaluate.py --from-json results/eval/results.json --out results/eval \
        --doc-json docs/results/evaluation.json   # measure nothing: report and compact results again
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

from evaluation import compact, estimates, plots, report, runner
from evaluation.link import ShapedLoopback, inside_namespace
from evaluation.plan import PROFILES, VARIANTS
from lynx_testing.netns import isolated


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/eval", help="report folder (created)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full",
                        help="full: the documented run (40.1 min here, aimed at 45); smoke: the smallest end-to-end run")  # fmt: skip
    parser.add_argument("--models", default="smollm2,qwen2", help="comma-separated: smollm2, qwen2")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--from-json", metavar="RESULTS_JSON",
                        help="measure nothing: rebuild the estimator check, report and plots from a run's results.json")  # fmt: skip
    parser.add_argument("--doc-json", metavar="PATH", type=Path,
                        help="also write the compact results (every figure docs/RESULTS.md states, no tokens) to PATH")  # fmt: skip
    args = parser.parse_args(argv)
    plans = PROFILES[args.profile]()
    for name in _names(args.models):
        if name not in plans:
            parser.error(f"unknown model {name!r}; choose from {', '.join(plans)}")
    for name in _names(args.variants):
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    return args


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


class Progress:
    """One progress bar on stderr for the whole run; safe to step from the background thread."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)
        self._lock = threading.Lock()

    def step(self, n: int = 1) -> None:
        with self._lock:
            self._bar.update(n)

    def phase(self, text: str) -> None:
        with self._lock:
            self._bar.set_description_str(text)

    def write(self, text: str) -> None:
        with self._lock:
            self._bar.write(text)

    def close(self) -> None:
        self._bar.close()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        return rebuild(Path(args.from_json), Path(args.out), args.doc_json)
    if not inside_namespace(os.environ):
        try:
            command = isolated([sys.executable, str(Path(__file__).resolve()), *argv])
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return subprocess.call(command)
    import torch

    torch.set_num_threads(1)  # like the servers (OMP_NUM_THREADS=1); the other core serves
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plans = PROFILES[args.profile]()
    models = [plans[name] for name in _names(args.models)]
    variants = [VARIANTS[name] for name in _names(args.variants)]
    link = ShapedLoopback()
    link.configure_tcp()
    link.set_rate(None)
    started = time.time()
    results = {
        "kind": "evaluation",
        "profile": args.profile,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_at_start": os.getloadavg()},
        "variants": [v.name for v in variants],
        "plans": {p.model: report.plan_summary(p) for p in models},
        "models": {},
    }
    progress = Progress(sum(runner.units(p, variants) for p in models))
    pending: list[runner.EarlyStart] = []  # an early start handed from one model to the next
    try:
        for index, plan in enumerate(models):
            next_plan = models[index + 1] if index + 1 < len(models) else None
            results["models"][plan.model] = runner.evaluate_model(plan, variants, out, link, progress, pending,
                                                                  next_plan)  # fmt: skip
    finally:
        while pending:
            pending.pop().discard()
        progress.close()
        link.set_rate(None)
    results["cluster"] = {"table": estimates.cluster_table(), "assumptions": estimates.CLUSTER_MODELS}
    results["cluster"]["ratios"] = estimates.cluster_ratios(results["cluster"]["table"])
    results["wall_s"] = time.time() - started
    results["machine"]["load_at_end"] = os.getloadavg()
    return write(results, out, args.doc_json)


def write(results: dict, out: Path, doc_json: Path | None = None) -> int:
    """`results.json`, the plots and `report.md` in `out`, the compact results at `doc_json`; a summary on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if doc_json is not None:
        labels = {name: plan.label for name, plan in PROFILES[results["profile"]]().items()}
        size = compact.write(results, labels, doc_json)
    figures = plots.render(results, out)
    text = report.render(results, figures)
    (out / "report.md").write_text(text)
    print(report.console_summary(results))
    print(f"\nreport: {out / 'report.md'}  JSON: {out / 'results.json'}  wall {results['wall_s'] / 60:.1f} min")
    if doc_json is not None:
        print(f"compact results: {doc_json} ({size / 1e3:.0f} kB)")
    return 0


def rebuild(source: Path, out: Path, doc_json: Path | None = None) -> int:
    """A run's report again from its measurements, with this checkout's estimator (nothing is measured)."""
    try:
        results = json.loads(source.read_text())
        if results.get("kind") != "evaluation":
            raise ValueError(f"its kind is {results.get('kind')!r}")
        plans = PROFILES[results["profile"]]()
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {source} is not an evaluation's results.json: {exc}", file=sys.stderr)
        return 2
    for name, data in results["models"].items():
        if data.get("speed") and "codec_rates" in data:
            data["estimator_check"] = estimates.check_rows(plans[name].geometry, data["speed"],
                                                           data["estimator_prefill_s"], data["codec_rates"])  # fmt: skip
    results["rebuilt"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return write(results, out, doc_json)


if __name__ == "__main__":
    sys.exit(main())

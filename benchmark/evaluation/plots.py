"""PNG plots of the evaluation (matplotlib, small files): TTFT against link rate, accuracy, likelihood, estimates."""

from __future__ import annotations

from pathlib import Path

COLORS = {"bf16": "#444444", "stock": "#999999", "stock-fp8": "#bbbbbb", "int8": "#1f77b4", "int4": "#2ca02c", "lynx": "#d62728",
          "lynx-2+6": "#ff7f0e"}  # fmt: skip
DPI = 80


def render(results: dict, out: Path) -> dict[str, str]:
    """Write every plot the results allow into `out`; returns {key: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    figures = {}
    for model, data in results["models"].items():
        if data.get("speed"):
            figures[f"ttft_{model}"] = _save(_ttft(model, data), out, f"ttft_{model}.png")
        if any("summary" in v for v in data["variants"].values()):
            figures[f"accuracy_{model}"] = _save(_accuracy(model, data), out, f"accuracy_{model}.png")
    if any("summary" in d.get("likelihood", {}) for d in results["models"].values()):
        figures["likelihood"] = _save(_likelihood(results), out, "likelihood.png")
    figures["estimate"] = _save(_estimate(results), out, "estimate.png")
    return figures


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


def _ttft(model: str, data: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharex=True)
    for variant in COLORS:
        rows = sorted((r for r in data["speed"] if r["variant"] == variant), key=lambda r: r["link_gbps"])
        if not rows:
            continue
        x = [r["link_gbps"] for r in rows]
        for ax, key in zip(axes, ("t1_s", "t32_s")):
            y = [r.get(key) for r in rows]
            if any(v is not None for v in y):
                ax.plot(x, y, marker="o", color=COLORS[variant], label=variant)
    rates = sorted({r["link_gbps"] for r in data["speed"]})
    for ax, title in zip(axes, ("time to first token", "time to 32nd token")):
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:.3g}" for r in rates], minor=False)
        ax.set_xticks([], minor=True)  # the measured rates only: log-axis minor labels overlap
        ax.set_xlabel("emulated link, Gbit/s")
        ax.set_ylabel("seconds")
        ax.set_title(f"{model}: {title}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return fig


def _accuracy(model: str, data: dict):
    import matplotlib.pyplot as plt

    names = [n for n, v in data["variants"].items() if "summary" in v]
    tasks = sorted({t for n in names for t in data["variants"][n]["summary"]["by_task"]})
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        by_task = data["variants"][name]["summary"]["by_task"]
        y = [by_task.get(t, {}).get("mean_score", 0.0) for t in tasks]
        ax.bar([j + i * width for j in range(len(tasks))], y, width, label=name, color=COLORS.get(name))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("string_match_all")
    ax.set_title(f"{model}: task accuracy per variant", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    return fig


def _likelihood(results: dict):
    import matplotlib.pyplot as plt

    models = [m for m, d in results["models"].items() if "summary" in d.get("likelihood", {})]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for k, model in enumerate(models):
        summary = results["models"][model]["likelihood"]["summary"]
        codecs = list(summary)
        for ax, key in zip(axes, ("kl", "delta_nll")):
            mean = [summary[c][key]["mean"] for c in codecs]
            err = [[m - summary[c][key]["low"] for m, c in zip(mean, codecs)],
                   [summary[c][key]["high"] - m for m, c in zip(mean, codecs)]]  # fmt: skip
            x = [j + 0.35 * k for j in range(len(codecs))]
            ax.bar(x, mean, 0.35, yerr=err, capsize=2, label=model)
            ax.set_xticks([j + 0.175 for j in range(len(codecs))], codecs, fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_title("KL(bf16 || context KV), nats/token", fontsize=9)
    axes[1].set_title("Δ NLL vs bf16, nats/token (95% CI)", fontsize=9)
    axes[0].legend(fontsize=7)
    return fig


def _estimate(results: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for model, data in results["models"].items():
        check = data.get("estimator_check") or []
        x = [c["measured_ttft_s"] for c in check if c["measured_ttft_s"]]
        y = [c["estimated_ttft_s"] for c in check if c["measured_ttft_s"]]
        axes[0].scatter(x, y, s=14, label=model)
    lim = [0, max([1.0] + [c["measured_ttft_s"] or 0 for d in results["models"].values()
                           for c in d.get("estimator_check") or []]) * 1.1]  # fmt: skip
    axes[0].plot(lim, lim, color="#888888", lw=0.8)
    axes[0].set_xlabel("measured TTFT, s (this CPU)")
    axes[0].set_ylabel("estimated TTFT, s")
    axes[0].set_title("estimator vs measured rows", fontsize=9)
    axes[0].legend(fontsize=7)
    table = results["cluster"]["table"]
    for mode in ("bf16", "int8", "int4", "lynx", "lynx-2+6"):
        rows = sorted((r for r in table if r["model"] == "llama-3.1-8b" and r["tokens"] == 32768 and r["mode"] == mode),
                      key=lambda r: r["link_gbps"])  # fmt: skip
        axes[1].plot([r["link_gbps"] for r in rows], [r["ttft_s"] for r in rows], marker="o",
                     color=COLORS.get(mode), label=mode)  # fmt: skip
    axes[1].set_xscale("log")
    axes[1].set_xlabel("link, Gbit/s")
    axes[1].set_ylabel("TTFT, s (ESTIMATE)")
    axes[1].set_title("Llama-3.1-8B, 32k tokens: estimate", fontsize=9)
    axes[1].legend(fontsize=7)
    return fig

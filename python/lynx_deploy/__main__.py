"""A prefill/decode pair with --lynx and SGLang's router on one machine, until Ctrl-C.

    python -m lynx_deploy --lynx-mode lynx      # starts all three, prints URLs, waits for Ctrl-C
"""

from __future__ import annotations

import argparse
import signal
import sys

from lynx_deploy.deployment import PDDeployment
from lynx_deploy.models import prepare_smollm2
from lynx_deploy.server import ServerStartError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lynx_deploy", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="model folder (default: SmolLM2 from the cache)")
    parser.add_argument("--log-dir", default="lynx-logs", help="folder for the three logs")
    parser.add_argument("--max-total-tokens", type=int, default=16384)
    args, lynx_args = parser.parse_known_args(argv)
    model = args.model_path or prepare_smollm2()
    deployment = PDDeployment(model, lynx_args, log_dir=args.log_dir, max_total_tokens=args.max_total_tokens)
    print(f"[lynx] starting prefill, decode and router (logs in {args.log_dir})", flush=True)
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    try:
        with deployment:
            print(f"[lynx] ready: router {deployment.url}, model '{deployment.served_model_name}'", flush=True)
            # Blocked only now: the servers inherited the default signal mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
            signal.sigwait(stop_signals)
    except ServerStartError as exc:
        print(f"[lynx] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

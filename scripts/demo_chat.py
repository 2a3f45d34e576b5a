"""Main job: a real prefill/decode pair with --lynx behind SGLang's router answers an OpenAI chat completion.

    python scripts/demo_chat.py [--question TEXT] [--mode lynx] [--log-dir DIR]

Starts a prefill server and a decode server (real SGLang, `--lynx`, SmolLM2,
this CPU) and the `smg` router, asks one chat completion through the router
with the `openai` client, prints the answer and that completion's own Lynx
metrics, and stops everything. The metrics come back in the response itself:
SGLang's `return_meta_info` puts the decode server's `meta_info`, which holds
Lynx's `meta_info["lynx"]`, into each choice. The servers' logs go to the
cache folder (`$LYNX_CACHE_DIR`, default `~/.cache/lynx`), under `demo-logs`.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

from lynx_deploy.models import default_cache_dir, prepare_smollm2
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.server import CPU_MODEL_ARGS, ServerStartError
from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", default="What is the capital of France? Answer in one sentence.")
    parser.add_argument("--mode", default="lynx", choices=["bf16", "int8", "int4", "lynx"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--log-dir", type=Path, default=default_cache_dir() / "demo-logs", help="folder for the servers' logs"
    )
    args = parser.parse_args()

    model = prepare_smollm2()
    print(f"[lynx] starting prefill + decode (--lynx-mode {args.mode}) and the router; logs in {args.log_dir}")
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as secret_dir:
            secret = Path(secret_dir) / "lynx-secret"
            secret.write_text(secrets.token_hex(32))
            lynx_args = ["--lynx-mode", args.mode, "--lynx-secret-file", str(secret)]
            with PDDeployment(model, lynx_args, extra_args=CPU_MODEL_ARGS, log_dir=args.log_dir) as pd:
                print(f"[lynx] ready at {pd.url} after {time.monotonic() - started:.0f}s", flush=True)
                client = OpenAI(base_url=f"{pd.url}/v1", api_key="none")
                reply = client.chat.completions.create(
                    model=pd.served_model_name,
                    messages=[{"role": "user", "content": args.question}],
                    max_tokens=args.max_tokens,
                    temperature=0,
                    extra_body={"return_meta_info": True},
                )
    except ServerStartError as exc:
        print(f"[lynx] error: {exc}", file=sys.stderr)
        return 1
    choice = reply.choices[0]
    lynx = (getattr(choice, "meta_info", None) or {}).get("lynx")
    print(f"Q: {args.question}")
    print(f"A: {choice.message.content}")
    if lynx is None:
        print("[lynx] error: the chat completion carries no meta_info['lynx']", file=sys.stderr)
        return 1
    print(f"[lynx] metrics of this chat completion: {json.dumps(lynx)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

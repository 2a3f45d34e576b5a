"""Main job: a real prefill/decode pair with --lynx behind SGLang's router answers an OpenAI chat completion.

    python scripts/demo_chat.py [--question TEXT] [--mode lynx] [--log-dir DIR]

Starts a prefill server and a decode server (real SGLang, `--lynx`, SmolLM2,
this CPU) and the `smg` router, asks one chat completion through the router
with the `openai` client, prints the answer and the request's Lynx metrics,
and stops everything.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

from lynx.models import prepare_smollm2
from lynx_testing.deploy import PDDeployment
from lynx_testing.launch import CPU_MODEL_ARGS, ServerStartError, post_json
from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", default="What is the capital of France? Answer in one sentence.")
    parser.add_argument("--mode", default="lynx", choices=["bf16", "int8", "int4", "lynx"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--log-dir", default="lynx-demo-logs", help="folder for the servers' logs")
    args = parser.parse_args()

    model = prepare_smollm2()
    secret = Path(tempfile.mkdtemp()) / "lynx-secret"
    secret.write_text(secrets.token_hex(32))
    lynx_args = ["--lynx-mode", args.mode, "--lynx-secret-file", str(secret)]
    print(f"[lynx] starting prefill + decode (--lynx-mode {args.mode}) and the router; logs in {args.log_dir}")
    started = time.monotonic()
    try:
        with PDDeployment(model, lynx_args, extra_args=CPU_MODEL_ARGS, log_dir=args.log_dir) as pd:
            print(f"[lynx] ready at {pd.url} after {time.monotonic() - started:.0f}s", flush=True)
            client = OpenAI(base_url=f"{pd.url}/v1", api_key="none")
            reply = client.chat.completions.create(
                model=pd.served_model_name,
                messages=[{"role": "user", "content": args.question}],
                max_tokens=args.max_tokens,
                temperature=0,
            )
            native = post_json(
                f"{pd.url}/generate",
                {"text": args.question, "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
            )
    except ServerStartError as exc:
        print(f"[lynx] error: {exc}", file=sys.stderr)
        return 1
    print(f"Q: {args.question}")
    print(f"A: {reply.choices[0].message.content}")
    print(f"[lynx] metrics of a /generate request: {json.dumps(native['meta_info'].get('lynx'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Main job: a real SGLang server with --lynx on this CPU answers an OpenAI chat completion.

    python scripts/demo_chat.py [--question TEXT] [--log FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

from openai import OpenAI

from lynx.models import prepare_smollm2
from lynx_patches.launch import ServerStartError, SGLangServer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", default="What is the capital of France? Answer in one sentence.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--log", default="lynx-demo-server.log", help="server log file")
    args = parser.parse_args()

    model = prepare_smollm2()
    print(f"[lynx] starting SGLang with --lynx on {model} (30-60 s; log: {args.log})", flush=True)
    started = time.monotonic()
    try:
        with SGLangServer(model, ["--lynx", "--served-model-name", "smollm2"], log_path=args.log) as server:
            print(f"[lynx] server ready at {server.url} after {time.monotonic() - started:.0f}s", flush=True)
            client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
            reply = client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": args.question}],
                max_tokens=args.max_tokens,
                temperature=0,
            )
    except ServerStartError as exc:
        print(f"[lynx] error: {exc}", file=sys.stderr)
        return 1
    print(f"Q: {args.question}")
    print(f"A: {reply.choices[0].message.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

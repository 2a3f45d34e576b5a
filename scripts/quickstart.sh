#!/usr/bin/env bash
# README command 1: set everything up, then run the main job: a real SGLang
# server with --lynx on this CPU answers an OpenAI chat completion.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python scripts/demo_chat.py "$@"

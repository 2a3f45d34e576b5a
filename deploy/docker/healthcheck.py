#!/usr/bin/env python3
"""Container health check: GET $LYNX_HEALTH_URL and exit 0 on HTTP 200, 1 otherwise.

    LYNX_HEALTH_URL      default http://127.0.0.1:30000/health (a server);
                         a router is checked on /readiness (healthy workers behind it)
    LYNX_HEALTH_TIMEOUT  seconds to wait for the answer; default
                         $SGLANG_HEALTH_CHECK_TIMEOUT + 10 (SGLang's /health
                         waits that long for a one-token generation), else 30

Installed in the images as `lynx-healthcheck` (Dockerfile HEALTHCHECK).
"""

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = os.environ.get("LYNX_HEALTH_URL", "http://127.0.0.1:30000/health")
    default_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")) + 10
    timeout = float(os.environ.get("LYNX_HEALTH_TIMEOUT", default_timeout))
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"unhealthy: {url} answered HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

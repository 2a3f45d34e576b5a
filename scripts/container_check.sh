#!/usr/bin/env bash
# End-to-end check of the `cpu` container image, for real: build it, start a
# prefill server, a decode server (both SGLang with --lynx) and SGLang's router
# from it, ask one OpenAI chat completion through the router, check the answer
# and the completion's own Lynx metrics, and stop everything whatever happens.
# Prints the build time, the image size and the time from starting the
# containers to the answer.
#
#   scripts/container_check.sh              build (layers cached) and check
#   scripts/container_check.sh --compose    the same, the three containers brought up
#                                           from deploy/compose.yaml with podman-compose
#   scripts/container_check.sh --no-cache   rebuild every layer, then check
#   scripts/container_check.sh --json PATH  also record the run, passed or failed, in PATH
#                                           (with --compose or --no-cache too)
#   scripts/container_check.sh --prepare    only install podman and make the base image
#
# --json appends one record to PATH's {"runs": [...]} (made when missing) as
# the run ends, whatever ended it: its date, commit, host (cores, CPU, memory,
# load average), podman's version, the options, whether the build started
# from an empty layer cache (--no-cache, or no image but the base; null when
# unknown), the build seconds, the image's bytes, the seconds from starting
# the containers to the router ready and to the first answer, the completion
# (its seconds, text and meta_info["lynx"]), and passed or the failure.
# benchmark/container_report.py renders docs/DEPLOY.md's table from it. It
# needs python3 on the host.
#
# Runs podman with host networking; every server binds 127.0.0.1 and takes its
# PD addresses from SGLANG_HOST_IP=127.0.0.1, so all traffic stays on loopback.
# Where podman, runc or debootstrap are missing it installs them with apt-get
# (root needed), and where the base image is missing it makes one with
# debootstrap from the Debian mirror apt is configured with. --compose runs
# podman-compose from the project's .venv (pinned below, installed there when
# missing; scripts/setup.sh makes the .venv) on compose.yaml's fixed ports,
# which must be free. docs/DEPLOY.md ("Checking the image end to end")
# describes the run and its figures.
#
# Environment: LYNX_IMAGE (default localhost/lynx:cpu), LYNX_BASE_IMAGE
# (default localhost/debian:bookworm-slim; a name outside localhost/ is pulled
# by podman instead of made), LYNX_CHECK_TIMEOUT (seconds to wait for the
# router, default 900).
set -euo pipefail

IMAGE=${LYNX_IMAGE:-localhost/lynx:cpu}
BASE_IMAGE=${LYNX_BASE_IMAGE:-localhost/debian:bookworm-slim}
READY_TIMEOUT=${LYNX_CHECK_TIMEOUT:-900}
SUITE=bookworm
MODEL=/opt/lynx/cache/models/SmolLM2-135M-Instruct
SERVED_MODEL=smollm2
HOST=127.0.0.1
# Debian bookworm's podman-compose (1.0.3) adds a network to a `network_mode:
# host` service, which podman refuses.
PODMAN_COMPOSE=podman-compose==1.6.0
COMPOSE_FILE=deploy/compose.yaml

usage() { awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; }
refuse() { echo "[check] $*" >&2; exit 2; }

prepare_only=0
compose=0
build_flags=()
json_out=""
while (($#)); do
    case "$1" in
        --prepare) prepare_only=1 ;;
        --compose) compose=1 ;;
        --no-cache) build_flags+=(--no-cache) ;;
        --json)
            if (($# < 2)) || [[ $2 == -* ]]; then refuse "--json needs a PATH (see --help)"; fi
            json_out=$2
            shift
            ;;
        -h | --help) usage; exit 0 ;;
        *) refuse "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
if [[ -n $json_out ]]; then
    ((!prepare_only)) || refuse "--json records a check, which --prepare does not run"
    command -v python3 >/dev/null || refuse "--json needs python3"
    [[ $json_out == /* ]] || json_out="$PWD/$json_out"
    [[ -d $(dirname "$json_out") ]] || refuse "--json $json_out: no such directory"
fi
cd "$(dirname "$0")/.."

say() { echo "[check] $*"; }
failure=""  # die's message, for the run record
die() { failure=$*; echo "[check] FAILED: $*" >&2; exit 1; }

# --- the run record (--json) ------------------------------------------------------------------

started=$(date +%s)
# What the run measured; empty until measured.
layer_cache_empty="" build_s="" image_bytes="" ready_s="" first_answer_s="" result=""

# `check PATH`: exit 1 unless PATH is missing or holds {"runs": [...]}.
# `write PATH CLIENT_JSON KEY=VALUE...`: append one record to PATH's runs.
recorder=$(cat <<'PY'
import json, os, sys, time

def recorded(path):
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            runs = json.load(f)["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f'[check] {path} does not hold {{"runs": [...]}}: {exc}')
    if not isinstance(runs, list):
        raise SystemExit(f'[check] {path}: "runs" is not a list')
    return runs

def proc_field(name, key):  # the value of a "key: value" line of /proc/<name>
    try:
        with open(f"/proc/{name}") as f:
            for line in f:
                field, _, value = line.partition(":")
                if field.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None

mode, path = sys.argv[1:3]
runs = recorded(path)
if mode == "check":
    sys.exit(0)
client, given = sys.argv[3], dict(arg.split("=", 1) for arg in sys.argv[4:])
try:
    completion = json.loads(client)
except ValueError:
    completion = None

def number(key):
    return int(given[key]) if given[key] else None

def flag(key):
    return given[key] == "1" if given[key] else None

memory = proc_field("meminfo", "MemTotal")
record = {
    "date": time.strftime("%Y-%m-%d"), "commit": given["commit"] or None,
    "host": {"cpus": os.cpu_count(), "cpu_model": proc_field("cpuinfo", "model name"),
             "memory_bytes": int(memory.split()[0]) * 1024 if memory else None,
             "load_average": [round(x, 2) for x in os.getloadavg()]},
    "podman": given["podman"] or None, "podman_compose": given["podman_compose"] or None,
    "image": given["image"], "compose": flag("compose"), "no_cache": flag("no_cache"),
    "layer_cache_empty": flag("layer_cache_empty"), "build_s": number("build_s"),
    "image_bytes": number("image_bytes"), "router_ready_s": number("router_ready_s"),
    "first_answer_s": number("first_answer_s"), "completion": completion,
    "total_s": number("total_s"), "passed": flag("passed"), "failure": given["failure"] or None,
}
new = not os.path.exists(path)
with open(path, "w") as f:
    f.write(json.dumps({"runs": [*runs, record]}, indent=1) + "\n")
if new and "SUDO_UID" in os.environ:
    os.chown(path, int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"]))
print(f"[check] recorded as run {len(runs) + 1} of {path}")
PY
)

git_() {  # git as the user who ran sudo: git refuses root in another user's checkout
    if [[ -n ${SUDO_USER:-} ]] && command -v sudo >/dev/null; then sudo -n -u "$SUDO_USER" git "$@"; else git "$@"; fi
}
commit=""
if [[ -n $json_out ]]; then
    python3 -c "$recorder" check "$json_out" || exit 2
    commit=$(git_ rev-parse --short HEAD 2>/dev/null) || commit=""
fi

record() {  # RC: append this run, which ends with exit status RC, to $json_out
    local rc=$1 message=$failure podman_version="" compose_version=""
    if ((rc == 130)); then
        message="interrupted"
    elif ((rc != 0)) && [[ -z $message ]]; then
        message="exited with status $rc"
    fi
    podman_version=$(podman --version 2>/dev/null | awk '{ print $3 }') || podman_version=""
    if ((compose)); then compose_version=${PODMAN_COMPOSE#*==}; fi
    python3 -c "$recorder" write "$json_out" "$result" \
        commit="$commit" podman="$podman_version" podman_compose="$compose_version" image="$IMAGE" \
        compose="$compose" no_cache="$((${#build_flags[@]} > 0))" layer_cache_empty="$layer_cache_empty" \
        build_s="$build_s" image_bytes="$image_bytes" router_ready_s="$ready_s" \
        first_answer_s="$first_answer_s" total_s="$(($(date +%s) - started))" \
        passed="$((rc == 0))" failure="$message"
}

WORK=$(mktemp -d -t lynx-container-check.XXXXXX)
containers=()
volumes=()
project=""  # the compose project, once brought up

cleanup() {
    local rc=$?
    if [[ -n $json_out ]]; then
        record "$rc" || echo "[check] could not record this run in $json_out" >&2
    fi
    if ((${#containers[@]})); then
        if ((rc != 0)); then
            for name in "${containers[@]}"; do
                echo "----- last lines of $name -----" >&2
                podman_ logs --tail 30 "$name" >&2 2>&1 || true
            done
        fi
        say "stopping ${containers[*]}"
    fi
    if [[ -n $project ]]; then
        compose_ down --volumes --timeout 10 >/dev/null 2>&1 || true
    fi
    if ((${#containers[@]})); then
        podman_ rm --force --time 10 "${containers[@]}" >/dev/null 2>&1 || true
    fi
    if ((${#volumes[@]})); then
        podman_ volume rm --force "${volumes[@]}" >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- podman, configured for this kind of sandbox --------------------------------------------

ensure_tools() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    if [[ $BASE_IMAGE == localhost/* ]] && ! command -v debootstrap >/dev/null; then
        missing+=(debootstrap)
    fi
    if ((${#missing[@]})); then
        [[ $(id -u) -eq 0 ]] || die "${missing[*]} missing; install them (apt-get install ${missing[*]}) or run this as root"
        say "installing ${missing[*]} with apt-get"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
    if ((compose)) && [[ $(.venv/bin/podman-compose --version 2>/dev/null | head -1) != *" ${PODMAN_COMPOSE#*==}" ]]; then
        [[ -x .venv/bin/python ]] || die "--compose runs podman-compose from .venv: run scripts/setup.sh first"
        say "installing $PODMAN_COMPOSE into .venv"
        .venv/bin/python -m pip install --quiet "$PODMAN_COMPOSE"
    fi
}

# podman's defaults (ulimits, systemd cgroups) fail in containers-in-a-sandbox
# set-ups; these settings work both there and on a normal host. The [engine]
# ones reach the podman that podman-compose runs.
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' \
    > "$WORK/containers.conf"
export CONTAINERS_CONF="$WORK/containers.conf"
podman_() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }
compose_() { .venv/bin/podman-compose --project-name "$project" --file "$COMPOSE_FILE" "$@"; }

ensure_base_image() {
    if podman_ image exists "$BASE_IMAGE"; then
        say "base image $BASE_IMAGE is present"
        return
    fi
    if [[ $BASE_IMAGE != localhost/* ]]; then
        say "pulling $BASE_IMAGE"
        podman_ pull "$BASE_IMAGE"
        return
    fi
    [[ $(id -u) -eq 0 ]] || die "making $BASE_IMAGE with debootstrap needs root"
    local mirror root
    mirror=$(scripts/debian_mirror.sh "$SUITE") || die "no mirror to make $BASE_IMAGE from"
    root="$WORK/rootfs"
    # ca-certificates: the build mounts the host's bundle over /etc/ssl/certs,
    # where the package could not be configured during the build.
    say "making $BASE_IMAGE: debootstrap --variant=minbase $SUITE from $mirror"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$root" "$mirror" > "$WORK/debootstrap.log" 2>&1 ||
        { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | podman_ import - "$BASE_IMAGE" >/dev/null
    rm -rf "$root"
    say "base image $BASE_IMAGE ready"
}

ensure_tools
ensure_base_image
if ((prepare_only)); then
    say "prepared: podman $(podman --version | awk '{print $3}'), base image $BASE_IMAGE"
    exit 0
fi

# --- build ------------------------------------------------------------------------------------

build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
ca_mount=()
# pip inside the build trusts the host's CA bundle, mounted for the build only.
if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
    ca_mount=(--volume /etc/ssl/certs:/etc/ssl/certs:ro)
fi
# Whether the build starts from an empty layer cache: with --no-cache, or with
# nothing in podman's storage but the base image; unknown ("") otherwise.
if ((${#build_flags[@]})); then
    layer_cache_empty=1
elif podman_ image exists "$IMAGE"; then
    layer_cache_empty=0
elif [[ $(podman_ images --all --quiet | sort -u | wc -l) == 1 ]]; then
    layer_cache_empty=1
fi
say "building $IMAGE (--target cpu; the first build downloads about 5 GB of wheels)"
build_start=$(date +%s)
if ! podman_ build --format docker --network host --target cpu --tag "$IMAGE" \
    "${build_args[@]}" "${ca_mount[@]}" "${build_flags[@]}" . 2>&1 | tee "$WORK/build.log" |
    { grep --line-buffered -E '^(\[[0-9]+/[0-9]+\] )?(STEP|COMMIT)' || true; }; then
    tail -30 "$WORK/build.log" >&2
    die "podman build failed"
fi
build_s=$(($(date +%s) - build_start))
image_bytes=$(podman_ image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in ${build_s}s; image size $(awk -v b="$image_bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }')"

# The image must hold this checkout's Lynx (a stale layer cache would not).
source_digest() {  # one digest of the .py files of Lynx's packages under the given roots
    local root pkg
    for root in "$@"; do
        (cd "$root" && for pkg in lynx lynx_deploy lynx_patches lynx_kernels; do
            if [[ -d $pkg ]]; then find "$pkg" -name '*.py' -print0; fi
        done | xargs -0 -r sha256sum)
    done | sort -k2 | sha256sum | cut -c1-16
}
here=$(source_digest python . kernels)
inside=$(podman_ run --rm --network none --no-healthcheck --entrypoint bash "$IMAGE" -c \
    "$(declare -f source_digest); source_digest \$(python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')")
[[ $here == "$inside" ]] || die "the image's Lynx ($inside) is not this checkout's ($here)"

# --- serve ------------------------------------------------------------------------------------

port_in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }
taken=" "
pick_port() {  # a free port on 127.0.0.1, not picked before; sets $port
    while :; do
        port=$((20000 + RANDOM % 40000))
        [[ $taken == *" $port "* ]] || port_in_use "$port" || break
    done
    taken+="$port "
}

# The transfer secret: made now, mounted read-only, never in the image.
secret_dir="$WORK/secret"
mkdir -m 700 "$secret_dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret_dir/lynx-secret"
chmod 444 "$secret_dir/lynx-secret"

tag=$$
# Hardened as the deployments run it: read-only root, writable /tmp and home
# (a named volume: podman's tmpfs would be root's), checks run by this script
# (podman schedules HEALTHCHECKs with systemd timers, which need not exist).
run_container() {  # name, health URL, command...
    local name=$1 health=$2
    shift 2
    volumes+=("$name-home")
    containers+=("$name")
    podman_ volume create "$name-home" >/dev/null
    podman_ run --detach --name "$name" --network host --shm-size 1g \
        --read-only --volume "$name-home:/home/lynx" --health-interval disable \
        --env SGLANG_HOST_IP=$HOST --env OMP_NUM_THREADS=1 \
        --env LYNX_HEALTH_URL="$health" \
        --volume "$secret_dir/lynx-secret:/run/secrets/lynx-secret:ro" \
        "$IMAGE" "$@" >/dev/null 2>"$WORK/$name.err" || { cat "$WORK/$name.err" >&2; die "cannot start $name"; }
}

serve_containers() {  # three `podman run`s on free ports
    pick_port; prefill_port=$port
    pick_port; decode_port=$port
    pick_port; bootstrap_port=$port
    pick_port; router_port=$port
    pick_port; router_metrics_port=$port
    local server_args=(
        python -m sglang.launch_server
        --model-path "$MODEL" --served-model-name "$SERVED_MODEL"
        --lynx --lynx-secret-file /run/secrets/lynx-secret
        --host "$HOST" --disaggregation-bootstrap-port "$bootstrap_port"
        --mem-fraction-static 0.3 --max-total-tokens 16384
        --dtype float32 --kv-cache-dtype bfloat16
        --enable-metrics
    )
    say "starting prefill (:$prefill_port), decode (:$decode_port) and router (:$router_port) containers"
    run_container "lynx-check-prefill-$tag" "http://$HOST:$prefill_port/health" \
        "${server_args[@]}" --port "$prefill_port" --disaggregation-mode prefill
    run_container "lynx-check-decode-$tag" "http://$HOST:$decode_port/health" \
        "${server_args[@]}" --port "$decode_port" --disaggregation-mode decode
    run_container "lynx-check-router-$tag" "http://$HOST:$router_port/readiness" \
        smg launch --pd-disaggregation \
        --prefill "http://$HOST:$prefill_port" "$bootstrap_port" \
        --decode "http://$HOST:$decode_port" \
        --host "$HOST" --port "$router_port" \
        --prometheus-host "$HOST" --prometheus-port "$router_metrics_port" \
        --worker-startup-check-interval 1 --health-check-interval-secs 10 \
        --health-check-timeout-secs 130 --log-level warn
    router_name="lynx-check-router-$tag"
}

serve_compose() {  # `podman-compose up` of deploy/compose.yaml, on its fixed ports
    router_port=30000 decode_port=30200
    local used
    for used in 30000 30100 30200 8998 29000; do
        port_in_use "$used" && die "port $used (deploy/compose.yaml) is in use"
    done
    project="lynx-check-$tag"
    export LYNX_IMAGE="$IMAGE" LYNX_SECRET_FILE="$secret_dir/lynx-secret"
    say "podman-compose --project-name $project --file $COMPOSE_FILE up --detach"
    compose_ up --detach > "$WORK/compose-up.log" 2>&1 || { tail -30 "$WORK/compose-up.log" >&2; die "podman-compose up failed"; }
    mapfile -t containers < <(podman_ ps --all --filter "label=io.podman.compose.project=$project" --format '{{.Names}}')
    ((${#containers[@]} == 3)) || die "podman-compose started ${#containers[@]} containers, not 3: ${containers[*]}"
    router_name=$(podman_ ps --all --filter "label=io.podman.compose.project=$project" \
        --filter label=com.docker.compose.service=router --format '{{.Names}}')
    say "started ${containers[*]}"
}

serve_start=$(date +%s)
if ((compose)); then serve_compose; else serve_containers; fi

# Ready when the router's own HEALTHCHECK (GET /readiness) passes: it answers
# 200 only once it has healthy prefill and decode workers.
say "waiting for the router's health check (up to ${READY_TIMEOUT}s)"
deadline=$(($(date +%s) + READY_TIMEOUT))
until podman_ healthcheck run "$router_name" >/dev/null 2>&1; do
    for name in "${containers[@]}"; do
        [[ $(podman_ inspect --format '{{.State.Running}}' "$name") == true ]] || die "$name exited"
    done
    (($(date +%s) < deadline)) || die "router not ready after ${READY_TIMEOUT}s"
    sleep 5
done
ready_s=$(($(date +%s) - serve_start))
say "router ready ${ready_s}s after the containers started"

# --- ask, and check -------------------------------------------------------------------------

# The client runs in a container from the same image (it has the openai package).
client=$(cat <<'PY'
import json, os, sys, time, urllib.request
from openai import OpenAI

router, decode, model = os.environ["ROUTER"], os.environ["DECODE"], os.environ["MODEL"]
question = "What is the capital of France? Answer in one sentence."
started = time.monotonic()
# return_meta_info: SGLang puts the decode server's meta_info, Lynx's metrics
# of this very completion included, into each choice.
reply = OpenAI(base_url=f"{router}/v1", api_key="none", timeout=600).chat.completions.create(
    model=model, messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0,
    extra_body={"return_meta_info": True},
)
answer = reply.choices[0].message.content
answer_s = time.monotonic() - started
lynx = (getattr(reply.choices[0], "meta_info", None) or {}).get("lynx")
# The decode scheduler counts a finished request on its next iteration: poll.
deadline = time.monotonic() + 30
while True:
    with urllib.request.urlopen(f"{decode}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    requests = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("lynx:requests_total"))
    if requests >= 1 or time.monotonic() > deadline:
        break
    time.sleep(1)
print(json.dumps({"answer": answer, "answer_s": round(answer_s, 2), "lynx": lynx,
                  "lynx_requests_total": requests}))
PY
)
say "asking through the router: What is the capital of France?"
result=$(podman_ run --rm --network host --read-only --no-healthcheck \
    --env ROUTER="http://$HOST:$router_port" --env DECODE="http://$HOST:$decode_port" \
    --env MODEL="$SERVED_MODEL" "$IMAGE" python -c "$client") || die "the client failed"
first_answer_s=$(($(date +%s) - serve_start))
echo "$result"

check() {  # python expression over `r` (the client's JSON), message
    podman_ run --rm --network none --no-healthcheck "$IMAGE" python -c \
        "import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if ($1) else 1)" "$result" ||
        die "$2"
}
check '"paris" in r["answer"].lower()' "the answer does not name Paris"
check 'r["lynx"] and r["lynx"]["mode"] == "lynx" and 0 < r["lynx"]["anchor_ready_s"] <= r["lynx"]["residual_ready_s"]' \
    "the completion's meta_info shows no Lynx anchor and residual landing"
check 'r["lynx_requests_total"] >= 1' "the decode server's lynx:requests_total did not count the request"
for name in "${containers[@]}"; do
    podman_ healthcheck run "$name" >/dev/null 2>&1 || die "$name failed its HEALTHCHECK"
done

say "PASSED"
say "build ${build_s}s; image $(awk -v b="$image_bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }'); router ready ${ready_s}s; first answer ${first_answer_s}s after the containers started"

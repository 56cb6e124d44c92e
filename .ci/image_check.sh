#!/usr/bin/env bash
# Image check: build the CPU image from the unchanged Dockerfile without a Docker daemon, run it the
# way the Kubernetes manifests do (read-only root, uid 10001, no capabilities) and check serving
# and graceful shutdown. Root only (buildah/podman with runc). docs/deployment.md.
#
#   make image-check                      # or: bash .ci/image_check.sh
#   IMAGE_CHECK_DIR=/var/tmp/x make image-check   # where storage, configs and logs go
#
# Image registries are not reachable here, so `python:3.11-slim` is a local stand-in built from
# Debian bookworm packages (python3 3.11, pip, venv) unless an image of that name is already in
# the check's storage. pip inside the build reaches PyPI through --network host.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${IMAGE_CHECK_DIR:-/var/tmp/transformer-serve-image-check}
IMAGE=${IMAGE_CHECK_IMAGE:-localhost/transformer-serve:cpu}
BASE=docker.io/library/python:3.11-slim
PORT=${IMAGE_CHECK_PORT:-18080}
NAME=transformer-serve-image-check
DRAIN_TIMEOUT_S=60
T0=$SECONDS
declare -a TIMES=()
PASSED=0

step() { printf '\n== [%4ss] %s\n' $((SECONDS - T0)) "$*"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
passed() { PASSED=$((PASSED + 1)); }
fail() { printf 'IMAGE CHECK FAILED: %s\n' "$*" >&2; exit 1; }
timed() { # timed LABEL CMD...: run CMD, record its wall time
    local label=$1 t=$SECONDS
    shift
    "$@"
    TIMES+=("$(printf '%-28s %4ss' "$label" $((SECONDS - t)))")
}

[[ $(id -u) -eq 0 ]] || fail "needs root (buildah/podman with runc, mmdebstrap)"
ls model_store/*/*/manifest.json >/dev/null 2>&1 ||
    fail "model_store/ holds no model version (model_store/<name>/<version>/manifest.json); the image bundles it"

install_tools() {
    local missing=()
    for tool in buildah podman runc mmdebstrap curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    [[ ${#missing[@]} -eq 0 ]] && { echo "buildah, podman, runc, mmdebstrap, curl present"; return; }
    echo "installing ${missing[*]} (and uidmap slirp4netns fuse-overlayfs) with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        buildah podman runc uidmap slirp4netns fuse-overlayfs mmdebstrap curl ca-certificates >/dev/null
}

write_configs() {
    mkdir -p "$WORK/conf"
    # Default ulimits may not exceed this machine's hard limits, or runc cannot set them.
    local nofile nproc
    nofile=$(ulimit -Hn); [[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
    nproc=$(ulimit -Hu); [[ $nproc == unlimited || $nproc -gt 4096 ]] && nproc=4096
    cat >"$WORK/conf/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    cat >"$WORK/conf/storage.conf" <<EOF
[storage]
driver = "overlay"
runroot = "$WORK/run"
graphroot = "$WORK/storage"
EOF
    export CONTAINERS_CONF=$WORK/conf/containers.conf CONTAINERS_STORAGE_CONF=$WORK/conf/storage.conf
}

stand_in_base() {
    if podman image exists "$BASE"; then
        echo "$BASE already in $WORK/storage: $(podman image inspect --format '{{.Created}}' "$BASE")"
        return
    fi
    # minbase bookworm + Debian's python3 (3.11); this machine's CA bundle so pip trusts what it
    # trusts; no EXTERNALLY-MANAGED marker (the official image has none). No compilers.
    mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,passwd \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"' \
        --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > "$1/etc/pip.conf"' \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        bookworm "$WORK/base.tar" http://deb.debian.org/debian
    podman import --quiet --change 'ENV=LANG=C.UTF-8' --change 'CMD=["python3"]' "$WORK/base.tar" "$BASE"
    rm -f "$WORK/base.tar"
}

build_image() {
    if ! buildah bud --isolation chroot --network host --pull=never --layers --format docker \
        --target cpu -t "$IMAGE" . >"$WORK/build.log" 2>&1; then
        tail -n 40 "$WORK/build.log"
        fail "image build (full log: $WORK/build.log)"
    fi
    passed
    grep -cE 'STEP [0-9]+/' "$WORK/build.log" | sed 's/^/build steps run: /'
    grep -c -- '--> Using cache' "$WORK/build.log" | sed 's/^/of which cached: /' || true
}

inspect_image() {
    local user cmd health size
    user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
    cmd=$(podman image inspect --format '{{json .Config.Entrypoint}} {{json .Config.Cmd}}' "$IMAGE")
    health=$(podman image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE")
    size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    echo "user=$user cmd=$cmd"
    echo "healthcheck=$health"
    printf 'size=%s bytes (%s MB)\n' "$size" $((size / 1000000))
    [[ $user == 10001:10001 ]] || fail "image user is '$user', not 10001:10001"; passed
    [[ $cmd == '["transformer-serve"] ["serve"]' ]] || fail "not the exec form transformer-serve serve: $cmd"; passed
    local help  # read whole: `grep -q` would close the pipe early and podman fail on it (pipefail)
    help=$(podman run --rm --network none --no-healthcheck "$IMAGE" serve --help) ||
        fail "transformer-serve serve --help in the image exited non-zero"
    [[ $help == *"--max-batch-size N"* ]] || fail "transformer-serve serve --help in the image lists no flags"; passed
    [[ $health == *healthcheck.py* ]] || fail "image has no HEALTHCHECK"; passed
    podman run --rm --network none --no-healthcheck --entrypoint /bin/sh "$IMAGE" -c '
        for c in gcc cc c++ g++ clang make ld; do
            if command -v "$c" >/dev/null; then echo "compiler/tool present: $(command -v "$c")"; exit 1; fi
        done
        python -c "import onnxruntime as o; print(\"onnxruntime\", o.__version__, o.get_available_providers())"
        ls /app/model_store' || fail "image contents"
    passed
}

request() { # request METHOD PATH [JSON]: prints the body, then the status code on the last line
    local data=()
    [[ $# -ge 3 ]] && data=(-H 'content-type: application/json' --data "$3")
    curl -sS -m 120 -X "$1" "${data[@]}" -w '\n%{http_code}' "http://127.0.0.1:$PORT$2"
}

expect() { # expect CODE METHOD PATH [JSON]
    local code=$1 out status
    shift
    out=$(request "$@") || fail "$1 $2: no answer"
    status=${out##*$'\n'}
    printf '%s %s -> %s %s\n' "$1" "$2" "$status" "$(head -c 300 <<<"${out%$'\n'*}")"
    [[ $status == "$code" ]] || fail "$1 $2 answered $status, expected $code"; passed
}

start_container() {
    podman rm -f "$NAME" >/dev/null 2>&1 || true
    # As in k8s/base: read-only root with only /tmp writable, uid 10001, no capabilities.
    # No systemd here for podman's healthcheck timer (it says so on stderr; dropped): the check
    # runs the image's HEALTHCHECK itself with `podman healthcheck run`.
    podman run -d --name "$NAME" --network host --read-only --read-only-tmpfs=false \
        --tmpfs /tmp:rw,size=256m,mode=1777 --user 10001 --cap-drop ALL \
        --security-opt no-new-privileges -e SERVE_PORT="$PORT" -e SERVE_DRAIN_TIMEOUT_S="$DRAIN_TIMEOUT_S" \
        "$IMAGE" >/dev/null 2>"$WORK/run.err" || { cat "$WORK/run.err"; fail "podman run"; }
    grep -v 'systemd connection' "$WORK/run.err" >&2 || true
    local deadline=$((SECONDS + 300))
    until [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/readyz" || true) == 200 ]]; do
        if [[ $(podman inspect --format '{{.State.Running}}' "$NAME") != true ]]; then
            podman logs "$NAME" | tail -n 40
            fail "container exited before it was ready"
        fi
        [[ $SECONDS -lt $deadline ]] || { podman logs "$NAME" | tail -n 40; fail "not ready after 300 s"; }
        sleep 1
    done
    echo "ready after $((SECONDS - deadline + 300)) s"; passed
}

serve_checks() {
    expect 200 GET /healthz
    expect 200 GET /readyz
    expect 200 GET /v1/models
    expect 200 GET /docs
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/docs/assets/swagger-ui-bundle.js" || fail "/docs assets"; passed
    expect 200 POST /predict '{"texts": ["What a wonderful, moving film.", "The update broke everything."]}'
    expect 200 POST /translate '{"texts": ["Open the file.", "Save the document as PDF."]}'
    podman healthcheck run "$NAME" || fail "HEALTHCHECK reported unhealthy"
    echo "HEALTHCHECK: healthy"; passed
    curl -sf "http://127.0.0.1:$PORT/metrics" | grep -cE '^[a-z_]+(\{|\s)' | sed 's/^/metrics samples: /'
}

shutdown_check() {
    # A slow request (64 texts, beam 8) is in flight when SIGTERM arrives: it must finish with
    # 200, /readyz and new requests must stop getting 200 at once, and the server must exit 0.
    local text body i out status t_term t_done exit_code ready_after new_after pid
    # Long source -> long outputs; about 4 s for the bundled en-de on two idle cores.
    text=${SLOW_REQUEST_TEXT:-"Open the settings dialog, change the default printer to the network printer in the office, save the document as a PDF file in your home folder, then close all windows and quit the application before you shut down the computer."}
    body='{"texts": ['
    for i in $(seq 64); do body+="\"$text\","; done
    body="${body%,}], \"beam_size\": 8}"
    request POST /translate "$body" >"$WORK/slow.out" 2>&1 &
    pid=$!
    sleep "${SLOW_REQUEST_HEAD_START_S:-0.5}"  # long enough for the request to be admitted
    if ! kill -0 "$pid" 2>/dev/null; then
        tail -c 300 "$WORK/slow.out"
        fail "the slow request was answered before SIGTERM: the check needs a slower one"
    fi
    t_term=$(date +%s.%N)
    podman kill --signal TERM "$NAME" >/dev/null
    sleep 0.5
    ready_after=$(curl -s -o /dev/null -m 5 -w '%{http_code}' "http://127.0.0.1:$PORT/readyz" || true)
    echo "/readyz 0.5 s after SIGTERM -> ${ready_after} (000: connection refused)"
    [[ $ready_after != 200 ]] || fail "/readyz still answers 200 after SIGTERM"; passed
    new_after=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -H 'content-type: application/json' \
        --data '{"texts": ["A new request during the drain."]}' "http://127.0.0.1:$PORT/predict" || true)
    echo "new /predict after SIGTERM -> ${new_after}"
    [[ $new_after != 200 ]] || fail "a new request was admitted after SIGTERM"; passed
    wait "$pid" || true
    t_done=$(since "$t_term")
    out=$(cat "$WORK/slow.out")
    status=${out##*$'\n'}
    echo "slow /translate answered $status, $t_done s after SIGTERM"
    [[ $status == 200 ]] || { echo "$out" | tail -c 500; fail "in-flight request answered $status during drain"; }
    passed
    exit_code=$(timeout $((DRAIN_TIMEOUT_S + 30)) podman wait "$NAME") || fail "server still running $((DRAIN_TIMEOUT_S + 30)) s after SIGTERM"
    echo "container exited with $exit_code, $(since "$t_term") s after SIGTERM"
    podman logs "$NAME" 2>&1 | tail -n 8
    [[ $exit_code == 0 ]] || fail "exit code $exit_code after SIGTERM"; passed
}

cleanup() { podman rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

mkdir -p "$WORK"
step "tools";                     timed tools install_tools
write_configs
step "stand-in base image $BASE"; timed "stand-in base" stand_in_base
step "build $IMAGE (target cpu)"; timed "build" build_image
step "inspect image";             timed inspect inspect_image
step "run (read-only, uid 10001, cap-drop ALL)"; timed "start until /readyz" start_container
step "serve";                     timed serve serve_checks
step "SIGTERM during a slow request"; timed "graceful shutdown" shutdown_check
step "summary"
printf '  %s\n' "${TIMES[@]}"
echo "image check passed in $((SECONDS - T0)) s: $(podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$IMAGE")"
echo "image-check: $PASSED passed, 0 failed"  # a failed check exits at once, above

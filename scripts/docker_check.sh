#!/usr/bin/env bash
# make docker-check: build the Dockerfile with podman on a Debian base made here, run the image, and check it:
# ready on /readyz, tests/images/nuclei.png labelled through the API exactly as densecnn labels it outside the
# container (.venv) with an API key made in the data volume (401 without it), the server not root, the HEALTHCHECK passing, SIGTERM stopping it cleanly; prints the sizes
# and times. The commands are those of docs/service.md#container.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=localhost/densecnn-base:bookworm
IMAGE=localhost/densecnn:latest
CONTAINER=densecnn-check-$$
VOLUME=densecnn-check-$$
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
WORK=$(mktemp -d)

# podman as root (through sudo where needed), with this repository's settings (scripts/containers.conf);
# DISABLE_HC_SYSTEMD: podman times HEALTHCHECKs with systemd, which this machine lacks (the check runs it once)
engine() { ${SUDO} env CONTAINERS_CONF="$PWD/scripts/containers.conf" DISABLE_HC_SYSTEMD=true podman "$@"; }
fail() { echo "docker-check: $*" >&2; exit 1; }
since() { awk -v start="$1" -v now="$(date +%s.%N)" 'BEGIN { printf "%.1f", now - start }'; }
cleanup() {
  engine rm -f --time 0 "$CONTAINER" >/dev/null 2>&1 || true
  engine volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

[ -x .venv/bin/densecnn ] || fail "no .venv/bin/densecnn: run 'make venv' first (the reference labels come from it)"

missing=()
for tool in podman runc mmdebstrap curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (Debian packages)"
  ${SUDO} apt-get update -qq
  DEBIAN_FRONTEND=noninteractive ${SUDO} apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The base: Debian bookworm with python3 and venv but no headers (the Dockerfile's build stage installs them).
if engine image exists "$BASE"; then
  echo "base image $BASE: cached"
else
  start=$SECONDS
  ${SUDO} mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm - \
    | engine import --quiet - "$BASE" >/dev/null
  echo "base image $BASE: built in $((SECONDS - start)) s"
fi

# torch==2.13.0 from the wheel directory pip is configured with (as `make venv` installs it), where it holds that
# wheel; otherwise the Dockerfile's default index. pip in the build trusts the host's CA bundle.
wheels=$(.venv/bin/python -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\([^ ']*\)'$/\1/p" | head -n 1)
torch_source=()
if [ -n "$wheels" ] && compgen -G "$wheels/torch-2.13.0*.whl" >/dev/null; then
  torch_source=(-v "$wheels:/wheels:ro" --build-arg TORCH_FIND_LINKS=/wheels)
fi
start=$SECONDS
engine build --format docker --network host \
  --build-arg BASE_IMAGE="$BASE" "${torch_source[@]}" \
  -v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro --build-arg PIP_CERT=/run/host-ca.crt \
  -t "$IMAGE" . >"$WORK/build.log" 2>&1 \
  || { tail -n 40 "$WORK/build.log" >&2; fail "the image did not build (its log above)"; }
size=$(engine image inspect --format '{{.Size}}' "$IMAGE")
echo "image $IMAGE: built in $((SECONDS - start)) s, $((size / 1000000)) MB"

# the server listens on the container's every interface, so it needs an API key: made in the data volume first
key=$(engine run --rm -v "$VOLUME:/var/lib/densecnn" "$IMAGE" densecnn keys add check 2>/dev/null) \
  || fail "densecnn keys add failed in the container"
start=$(date +%s.%N)
engine run -d --name "$CONTAINER" -p 127.0.0.1::8000 -v "$VOLUME:/var/lib/densecnn" "$IMAGE" >/dev/null
url="http://$(engine port "$CONTAINER" 8000)"
for _ in $(seq 240); do
  curl -sf "$url/readyz" >/dev/null && break
  [ "$(engine inspect --format '{{.State.Running}}' "$CONTAINER")" = true ] \
    || { engine logs "$CONTAINER" >&2; fail "the container stopped before it was ready (its log above)"; }
  sleep 0.5
done
curl -sf "$url/readyz" >/dev/null || { engine logs "$CONTAINER" >&2; fail "$url/readyz not ready after 120 s"; }
echo "ready in $(since "$start") s at $url"

code=$(curl -s -o /dev/null -w '%{http_code}' -F image=@tests/images/nuclei.png "$url/v1/models/nuclei/segment")
[ "$code" = 401 ] || fail "a request without the key got $code, not 401"
curl -sf -H "Authorization: Bearer $key" -F image=@tests/images/nuclei.png "$url/v1/models/nuclei/segment" \
  -o "$WORK/container.png" || fail "POST $url/v1/models/nuclei/segment with the key failed"
echo "API key required (401 without it) and accepted"
.venv/bin/densecnn predict models/nuclei tests/images/nuclei.png "$WORK/host.png" --no-progress >/dev/null
.venv/bin/python scripts/compare_labels.py "$WORK/container.png" "$WORK/host.png" \
  || fail "the container's label map differs from densecnn's outside it"

uid=$(engine exec "$CONTAINER" python -c "import os; print(os.stat('/proc/1').st_uid)")
[ "$uid" != 0 ] || fail "the server runs as root"
echo "server runs as uid $uid"
engine healthcheck run "$CONTAINER" >/dev/null || fail "the image's HEALTHCHECK fails on a ready server"
echo "HEALTHCHECK: healthy"

# podman stop sends SIGTERM, and SIGKILL (exit code 137) if the server is still running 10 s later
start=$(date +%s.%N)
engine stop --time 10 "$CONTAINER" >/dev/null
stopped=$(since "$start")
code=$(engine inspect --format '{{.State.ExitCode}}' "$CONTAINER")
[ "$code" = 0 ] || { engine logs "$CONTAINER" >&2; fail "SIGTERM: exit code $code after $stopped s, not 0"; }
echo "SIGTERM: exit code 0 after $stopped s"
echo "docker-check: passed"

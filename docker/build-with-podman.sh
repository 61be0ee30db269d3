#!/usr/bin/env bash
# Build (and smoke-test) the ticdc-applier image without Docker and without pulling base images:
# a stand-in for python:3.11-slim-bookworm is made with mmdebstrap from Debian's packages, imported
# under that name, and the Dockerfile is built with buildah --isolation=chroot (no daemon, no user
# namespaces needed). Not run by CI. Needs root (or a working rootless setup) and network access to
# a Debian mirror and to PyPI (the build stage runs pip). The real container test
# (tests/deploy/test_container.py, `make test-container`) builds its images with it.
#
#   docker/build-with-podman.sh              # runtime image, tagged ticdc-applier:dev
#   TARGET=catchup docker/build-with-podman.sh
#   REFRESH_BASE=1 docker/build-with-podman.sh   # make the stand-in base again
#
# What is kept between runs, in podman's storage (/var/lib/containers/storage): the stand-in base,
# labelled with a digest of its recipe (the packages, the hooks, the CA bundle it carries), made
# again when the recipe changes, when it is older than BASE_MAX_AGE_DAYS (30: Debian's security
# updates) or with REFRESH_BASE=1 (the old one and the build layers made on it are then removed);
# and the layers of the builds (buildah --layers), reused while their inputs are unchanged.
#
# The stand-in is close to the official image where the Dockerfile relies on it: Debian bookworm,
# Python 3.11 with venv, pip and its headers (the build stage compiles the decoder's fast path),
# `python` on PATH, groupadd/useradd. It is not the official image:
# the real build uses the real one.
set -euo pipefail
cd "$(dirname "$0")/.."

# A local name: the stand-in is not the official image and must not pass for it.
BASE_NAME=${BASE_NAME:-localhost/ticdc-applier-base:bookworm-python3.11}
BASE_MAX_AGE_DAYS=${BASE_MAX_AGE_DAYS:-30}
TARGET=${TARGET:-runtime}
TAG=${TAG:-ticdc-applier:dev}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

need() { command -v "$1" >/dev/null 2>&1; }
if ! need mmdebstrap || ! need buildah || ! need podman; then
  echo "installing mmdebstrap, buildah and podman from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap buildah podman uidmap fuse-overlayfs >/dev/null
fi

# Where outgoing TLS goes through an intercepting proxy, pip trusts it only through PIP_CERT: the stand-in
# then carries the host's CA bundle and sets PIP_CERT, so that pip inside the build trusts the same CAs.
packages=python3,python3-venv,python3-pip,python3-dev,ca-certificates,passwd
hooks=(--customize-hook='chroot "$1" ln -sf /usr/bin/python3 /usr/local/bin/python'
       --customize-hook='chroot "$1" ln -sf /usr/bin/python3 /usr/local/bin/python3')
changes=(--change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8')
ca_file=/dev/null
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  ca_file=$PIP_CERT
  cp "$PIP_CERT" "$WORK/host-ca.crt"
  hooks+=(--customize-hook="cp $WORK/host-ca.crt \"\$1/usr/local/share/host-ca.crt\"")
  changes+=(--change 'ENV PIP_CERT=/usr/local/share/host-ca.crt')
fi
# The hooks name a temporary directory: the CA bundle's content stands for it in the recipe.
recipe=$( { printf '%s\n' bookworm minbase "$packages" "${hooks[@]//$WORK/}" "${changes[@]}"; cat "$ca_file"; } \
          | sha256sum | cut -c1-16)
# The label is inherited by every image built on the base: the build layers are found by it.
changes+=(--change "LABEL ticdc-applier.stand-in-base=$recipe")

base_state() {  # "fresh", or why the base must be made (again)
  if ! podman image exists "$BASE_NAME"; then echo "missing"; return; fi
  if [ "${REFRESH_BASE:-0}" = 1 ]; then echo "REFRESH_BASE=1"; return; fi
  local have created
  have=$(podman image inspect "$BASE_NAME" --format '{{index .Labels "ticdc-applier.stand-in-base"}}')
  if [ "$have" != "$recipe" ]; then echo "its recipe changed"; return; fi
  created=$(podman image inspect "$BASE_NAME" --format '{{.Created.Unix}}')
  if [ $(( $(date +%s) - created )) -gt $(( BASE_MAX_AGE_DAYS * 86400 )) ]; then
    echo "older than $BASE_MAX_AGE_DAYS days"; return
  fi
  echo fresh
}

state=$(base_state)
if [ "$state" != fresh ]; then
  echo "building the stand-in base $BASE_NAME with mmdebstrap ($state)"
  mmdebstrap --variant=minbase --include="$packages" "${hooks[@]}" bookworm "$WORK/base.tar"
  podman import "${changes[@]}" "$WORK/base.tar" "$BASE_NAME"
  # The base replaced leaves the old one and the layers built on it untagged: remove them. Tagged
  # images built on it stay until they are built again.
  podman image prune --force --filter label=ticdc-applier.stand-in-base >/dev/null
fi

# Pass the host's pip index settings through, so that a mirror configured here works in the build too.
pip_args=()
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
  if [ -n "${!var:-}" ]; then pip_args+=(--build-arg "$var=${!var}"); fi
done

# --format docker: the OCI image format has no HEALTHCHECK.
buildah bud --isolation=chroot --format docker --pull=never --layers \
  --build-arg "PYTHON_IMAGE=$BASE_NAME" "${pip_args[@]}" \
  --target "$TARGET" -t "$TAG" -f docker/Dockerfile .

echo "smoke test: the image's user, entrypoint and health check; applier --version and run --help in it"
podman image inspect "$TAG" \
  --format 'user={{.Config.User}} entrypoint={{.Config.Entrypoint}} cmd={{.Config.Cmd}} healthcheck={{.Config.Healthcheck}}'
# `buildah run --isolation=chroot` rather than `podman run`: it works in sandboxes where the OCI runtime
# may not set rlimits or namespaces.
ctr=$(buildah from --pull=never "$TAG")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
buildah run --isolation=chroot --user 10001:10001 "$ctr" -- applier --version
buildah run --isolation=chroot --user 10001:10001 "$ctr" -- applier run --help >/dev/null
buildah run --isolation=chroot --user 10001:10001 "$ctr" -- python -c 'import applier.daemon.loop, applier.ops.wiring'
if [ "$TARGET" = catchup ]; then
  buildah run --isolation=chroot --user 10001:10001 "$ctr" -- sh -c 'java -version && python -c "import pyspark"'
fi
echo "built $TAG (target $TARGET) on the stand-in $BASE_NAME"

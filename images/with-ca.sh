#!/bin/sh
# Run a command trusting the system CAs plus an extra CA given as the BuildKit secret `ca`.
# The combined bundle lives in a tmpfs for the duration of the command only: never in a layer.
# Usage (Dockerfile): RUN --mount=type=secret,id=ca,required=false with-ca.sh pip install ...
set -eu
extra="${CA_SECRET_FILE:-/run/secrets/ca}"
if [ ! -s "$extra" ]; then
    exec "$@"
fi
system=/etc/ssl/certs/ca-certificates.crt
dir=/dev/shm
[ -d "$dir" ] && [ -w "$dir" ] || dir=/tmp
bundle=$(mktemp "$dir/ca-bundle.XXXXXX")
trap 'rm -f "$bundle"' EXIT INT TERM
if [ -s "$system" ]; then cat "$system" >"$bundle"; fi
cat "$extra" >>"$bundle"
export PIP_CERT="$bundle" REQUESTS_CA_BUNDLE="$bundle" SSL_CERT_FILE="$bundle" \
    CURL_CA_BUNDLE="$bundle" GIT_SSL_CAINFO="$bundle" NODE_EXTRA_CA_CERTS="$bundle"
status=0
"$@" || status=$?
exit "$status"

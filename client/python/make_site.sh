#!/bin/bash
# Builds the importable `tutti` Python package into DIR/tutti: the package's sources plus the
# protobuf and gRPC code generated from proto/tutti/v1/kvcache.proto with the system protoc and
# grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc). Then:
#   PYTHONPATH=DIR python3 -c 'import tutti'
# Bazel runs this for //client/python:tutti (bazel-bin/client/python/site).
# tutti/_version.py holds the version (tuttid's, from //:version.bzl; Bazel passes it).
#
#   client/python/make_site.sh DIR [PROTO_ROOT] [VERSION] [KEYCHAIN_SO] [LOOKUP_SO]
#     PROTO_ROOT defaults to the repo's proto/, VERSION to TUTTI_VERSION of the repo's version.bzl;
#     KEYCHAIN_SO (//client/python:_keychain.abi3.so) becomes tutti/_keychain.abi3.so (the key
#     chains in C; without it tutti.chain_keys and tutti.vllm derive the same keys in Python);
#     LOOKUP_SO (//client/python:_lookup.abi3.so) becomes tutti/_lookup.abi3.so (Client.lookup_many
#     through libgrpc++; without it, through grpcio)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: make_site.sh DIR [PROTO_ROOT] [VERSION] [KEYCHAIN_SO] [LOOKUP_SO]}"
proto_root="${2:-$here/../../proto}"
version="${3:-$(sed -n 's/^TUTTI_VERSION = "\(.*\)"$/\1/p' "$here/../../version.bzl")}"
[ -n "$version" ] || { echo "make_site.sh: no version (version.bzl's TUTTI_VERSION)" >&2; exit 1; }
plugin="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"
mkdir -p "$out/tutti/v1"
cp "$here"/tutti/*.py "$out/tutti/"
printf '"""The version of tutti, the same as tuttid (version.bzl). Made by make_site.sh."""\n\n%s\n' \
  "__version__ = \"$version\"" >"$out/tutti/_version.py"
cp "$here"/tutti/v1/__init__.py "$out/tutti/v1/"
mkdir -p "$out/tutti/vllm"
cp "$here"/tutti/vllm/*.py "$out/tutti/vllm/"
if [ -n "${4:-}" ]; then
  cp "$4" "$out/tutti/_keychain.abi3.so"
  chmod 0755 "$out/tutti/_keychain.abi3.so"
fi
if [ -n "${5:-}" ]; then
  cp "$5" "$out/tutti/_lookup.abi3.so"
  chmod 0755 "$out/tutti/_lookup.abi3.so"
fi
protoc -I"$proto_root" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$proto_root/tutti/v1/kvcache.proto"

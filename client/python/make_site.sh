#!/bin/bash
# Builds the importable `tutti` Python package into DIR/tutti: the package's sources plus the
# protobuf and gRPC code generated from proto/tutti/v1/kvcache.proto with the system protoc and
# grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc). Then:
#   PYTHONPATH=DIR python3 -c 'import tutti'
# Bazel runs this for //client/python:tutti (bazel-bin/client/python/site).
#
#   client/python/make_site.sh DIR [PROTO_ROOT]      (PROTO_ROOT defaults to the repo's proto/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: make_site.sh DIR [PROTO_ROOT]}"
proto_root="${2:-$here/../../proto}"
plugin="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"
mkdir -p "$out/tutti/v1"
cp "$here"/tutti/*.py "$out/tutti/"
cp "$here"/tutti/v1/__init__.py "$out/tutti/v1/"
mkdir -p "$out/tutti/vllm"
cp "$here"/tutti/vllm/*.py "$out/tutti/vllm/"
protoc -I"$proto_root" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$proto_root/tutti/v1/kvcache.proto"

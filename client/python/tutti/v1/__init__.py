"""Generated protobuf and gRPC code of tutti's APIs (tutti/v1/*.proto).

The *_pb2.py modules are generated at build time, not kept in git: use the package from
`bazel build //client/python:tutti` (bazel-bin/client/python/site) or run
`client/python/make_site.sh DIR` (needs protoc and grpc_python_plugin) and put DIR on PYTHONPATH.
"""

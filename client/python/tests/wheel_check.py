"""Run with a venv's python after `pip install tutti-*.whl` (wheel_test.sh): the package, its
vLLM connector and the generated protobuf/gRPC modules import from the venv's site-packages; the
installed distribution's version is tuttid's; the quick start runs against a real tuttid."""

import argparse
import importlib
import importlib.metadata
import os
import subprocess
import sys
import sysconfig


def under(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True)
    ap.add_argument("--version", required=True, help="tuttid's (tuttid --version)")
    ap.add_argument("--vllm-stub", required=True, help="folder holding the vLLM stand-in")
    ap.add_argument("--tuttid", required=True)
    ap.add_argument("--quickstart", required=True)
    args = ap.parse_args()

    assert sys.prefix != sys.base_prefix, "not running in a virtual environment"
    assert under(sys.prefix, args.venv), (sys.prefix, args.venv)
    site = sysconfig.get_paths()["purelib"]
    assert under(site, args.venv), (site, args.venv)
    print("venv site-packages:", site)

    # vLLM is not installed (no index); tutti.vllm imports the stand-in, put after site-packages.
    sys.path.append(args.vllm_stub)

    for name in ("tutti", "tutti.v1.kvcache_pb2", "tutti.v1.kvcache_pb2_grpc", "tutti.client",
                 "tutti.testing", "tutti.vllm", "tutti.vllm.connector", "tutti._keychain",
                 "tutti._lookup"):
        module = importlib.import_module(name)
        assert under(module.__file__, site), "%s from %s, not %s" % (name, module.__file__, site)
        print("%-26s %s" % (name, os.path.relpath(module.__file__, site)))
    import vllm  # the stand-in (the runfiles link its files: compared unresolved)
    assert os.path.abspath(vllm.__file__).startswith(os.path.abspath(args.vllm_stub) + os.sep), \
        vllm.__file__
    # grpcio and protobuf: Debian's, through --system-site-packages.
    import google.protobuf
    import grpc
    for module in (grpc, google.protobuf):
        assert not under(module.__file__, args.venv), module.__file__
        print("%-26s %s %s" % (module.__name__, module.__version__, module.__file__))

    import tutti
    import tutti.vllm
    import tutti.v1.kvcache_pb2 as pb
    assert tutti.vllm.TuttiConnector.__module__ == "tutti.vllm.connector"
    assert pb.DESCRIPTOR.name == "tutti/v1/kvcache.proto", pb.DESCRIPTOR.name
    assert "KvCache" in pb.DESCRIPTOR.services_by_name
    import tutti.vllm.keys
    assert tutti.vllm.keys._native is not None, "the key chain in C did not load from the wheel"
    import tutti.client
    assert tutti.client.native_lookup() is not None, "tutti._lookup did not load from the wheel"

    dist = importlib.metadata.distribution("tutti")
    assert dist.version == args.version, "installed %s, tuttid %s" % (dist.version, args.version)
    assert tutti.__version__ == args.version, (tutti.__version__, args.version)
    files = {str(f) for f in dist.files}
    for f in ("tutti/v1/kvcache_pb2.py", "tutti/v1/kvcache_pb2_grpc.py", "tutti/_version.py",
              "tutti/vllm/connector.py", "tutti/_keychain.abi3.so"):
        assert f in files, "%s not in the wheel's RECORD" % f
    requires = dist.requires or []
    assert any(r.startswith("grpcio") for r in requires), requires
    assert any(r.startswith("protobuf") for r in requires), requires
    print("tutti %s (tuttid %s); requires %s" % (dist.version, args.version, ", ".join(requires)))

    # The quick start (docs/clients.md) with the venv's python against a real tuttid.
    with tutti.testing.Tuttid(binary=args.tuttid) as daemon:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        out = subprocess.run([sys.executable, args.quickstart, daemon.socket], env=env,
                             cwd=os.path.dirname(site), capture_output=True, text=True,
                             timeout=120)
        sys.stdout.write(out.stdout)
        sys.stderr.write(out.stderr)
        assert out.returncode == 0, "quickstart exited %d" % out.returncode
    print("wheel_check: OK")


if __name__ == "__main__":
    main()

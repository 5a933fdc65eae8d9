"""C++ code generation for .proto files with the system protoc and grpc_cpp_plugin (offline)."""

def tutti_cc_proto(name, srcs, grpc_srcs = [], deps = []):
    """Generates <name>: a cc_library over the messages of `srcs` and the services of `grpc_srcs`.

    Sources are given relative to the calling package, which is the import root
    (`import "tutti/v1/x.proto"`).
    """
    all_srcs = srcs
    pb_h = [s.replace(".proto", ".pb.h") for s in all_srcs]
    pb_cc = [s.replace(".proto", ".pb.cc") for s in all_srcs]
    grpc_h = [s.replace(".proto", ".grpc.pb.h") for s in grpc_srcs]
    grpc_cc = [s.replace(".proto", ".grpc.pb.cc") for s in grpc_srcs]
    pkg = native.package_name()
    native.genrule(
        name = name + "_gen",
        srcs = all_srcs,
        outs = pb_h + pb_cc + grpc_h + grpc_cc,
        cmd = " && ".join([
            "protoc -I" + pkg + " --cpp_out=$(GENDIR)/" + pkg + " " +
            " ".join([pkg + "/" + s for s in all_srcs]),
        ] + ([
            "protoc -I" + pkg + " --grpc_out=$(GENDIR)/" + pkg +
            " --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin " +
            " ".join([pkg + "/" + s for s in grpc_srcs]),
        ] if grpc_srcs else [])),
    )
    native.cc_library(
        name = name,
        srcs = pb_cc + grpc_cc,
        hdrs = pb_h + grpc_h,
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["@system//:protobuf", "@system//:grpc"],
    )

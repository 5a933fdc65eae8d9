// A gRPC server interceptor that gives requests gRPC could not decode the answer they deserve.
//
// gRPC's C++ server answers a request whose bytes do not parse as the method's message (truncated,
// wrong wire types, invalid UTF-8 in a string field) with INTERNAL and an empty message before any
// handler runs. Our handlers never answer INTERNAL without words, so that answer is rewritten to
// INVALID_ARGUMENT naming the method.
//
// Thread-safety: interceptors are created per call by gRPC.
#ifndef TUTTI_DAEMON_SERVER_DECODE_ERRORS_H_
#define TUTTI_DAEMON_SERVER_DECODE_ERRORS_H_

#include <memory>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace tutti::server {

// One factory for ServerBuilder::experimental().SetInterceptorCreators.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
DecodeErrorInterceptors();

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_DECODE_ERRORS_H_

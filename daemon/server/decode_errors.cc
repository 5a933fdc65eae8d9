#include "daemon/server/decode_errors.h"

#include <string>

#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"

namespace tutti::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

class DecodeErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit DecodeErrorInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status s = methods->GetSendStatus();
      if (s.error_code() == grpc::StatusCode::INTERNAL && s.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            method_ + ": the request could not be decoded as its tutti.v1 message (truncated, "
                      "wrong wire types, or a string field that is not UTF-8)"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new DecodeErrorInterceptor(info->method() != nullptr ? info->method() : "request");
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
DecodeErrorInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<Factory>());
  return out;
}

}  // namespace tutti::server

#include "client/cpp/session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/connect.h"
#include "common/handoff.h"

namespace tutti::client::internal {
namespace {

constexpr absl::Duration kMinBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Open(const SessionOptions& options,
                                                       tutti::v1::AttachRequest request,
                                                       std::vector<UniqueFd> fds) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      ConnectToTuttid(options.socket_path, options.connect_timeout);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<Session> session(
      new Session(options, *channel, std::move(request), std::move(fds)));
  if (absl::Status s = session->AttachNow(options.call_timeout); !s.ok()) return s;
  session->thread_ = std::thread(&Session::Loop, session.get());
  session->watcher_ = std::thread(&Session::WatchChannel, session.get());
  return session;
}

Session::Session(const SessionOptions& options, std::shared_ptr<grpc::Channel> channel,
                 tutti::v1::AttachRequest request, std::vector<UniqueFd> fds)
    : options_(options),
      channel_(std::move(channel)),
      stub_(tutti::v1::KvCache::NewStub(channel_)),
      request_(std::move(request)),
      fds_(std::move(fds)) {}

Session::~Session() { (void)Detach(); }

std::unique_ptr<grpc::ClientContext> Session::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  return ctx;
}

absl::Status Session::AttachNow(absl::Duration deadline) {
  std::vector<int> fds;
  for (const UniqueFd& fd : fds_) fds.push_back(fd.get());
  absl::StatusOr<std::string> credential = HandOff(options_.socket_path, fds, deadline);
  if (!credential.ok()) return credential.status();
  tutti::v1::AttachRequest request = request_;
  request.set_credential(*credential);
  tutti::v1::AttachResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  absl::Status s = FromGrpc(stub_->Attach(&ctx, request, &response));
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (state_ == State::kDetached) return absl::FailedPreconditionError("detached");
  state_ = State::kAttached;
  session_id_ = response.session_id();
  token_ = response.session_token();
  attach_ = response;
  ++generation_;
  return absl::OkStatus();
}

absl::StatusOr<Session::Current> Session::current() const {
  absl::MutexLock lock(&mu_);
  switch (state_) {
    case State::kAttached:
      return Current{session_id_, token_, generation_};
    case State::kLost:
      return absl::UnavailableError(absl::StrCat(
          "lost the session with tuttid at ", options_.socket_path,
          options_.reattach ? "; re-attaching in the background" : " (reattach is off)"));
    case State::kDetached:
      break;
  }
  return absl::FailedPreconditionError("detached from tuttid");
}

void Session::Observe(const absl::Status& status, uint64_t generation) {
  if (absl::IsUnavailable(status)) {
    MarkLost(generation, status);
  } else if (absl::IsNotFound(status)) {
    absl::MutexLock lock(&mu_);
    wake_ = true;
  }
}

void Session::MarkLost(uint64_t generation, const absl::Status& why) {
  (void)why;
  absl::MutexLock lock(&mu_);
  if (state_ != State::kAttached || generation != generation_) return;
  state_ = State::kLost;
  session_id_ = 0;
  token_.clear();
  wake_ = true;
}

void Session::Loop() {
  absl::Duration sleep = kMinBackoff;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stop_or_wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop_or_wake), sleep);
      if (stop_) return;
      wake_ = false;
    }
    sleep = Tick(sleep);
  }
}

void Session::WatchChannel() {
  grpc_connectivity_state state = channel_->GetState(false);
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // Bounded waits, so that a stop is seen within one of them.
    if (!channel_->WaitForStateChange(state,
                                      absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)))) {
      continue;
    }
    const grpc_connectivity_state now = channel_->GetState(false);
    if (state == GRPC_CHANNEL_READY && now != GRPC_CHANNEL_READY) {
      absl::MutexLock lock(&mu_);
      wake_ = true;  // Loop's KeepAlive finds out whether the session is gone
    }
    state = now;
  }
}

absl::Duration Session::Tick(absl::Duration backoff) {
  State state;
  Current cur;
  absl::Duration period;
  {
    absl::MutexLock lock(&mu_);
    state = state_;
    cur = {session_id_, token_, generation_};
    period = absl::Milliseconds(std::max<uint32_t>(attach_.session_ttl_ms() / 4, 10));
  }
  if (state == State::kAttached) {
    tutti::v1::KeepAliveRequest request;
    cur.Name(&request);
    tutti::v1::KeepAliveResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::max(period, absl::Seconds(1))));
    absl::Status s = FromGrpc(stub_->KeepAlive(&ctx, request, &response));
    if (absl::IsUnavailable(s) || absl::IsNotFound(s) || absl::IsDeadlineExceeded(s)) {
      MarkLost(cur.generation, s);
      return kMinBackoff;
    }
    return period;
  }
  if (state == State::kLost && options_.reattach) {
    if (AttachNow(std::max(options_.connect_timeout, absl::Seconds(1))).ok()) return period;
    return std::min(backoff * 2, kMaxBackoff);
  }
  return kMaxBackoff;
}

void Session::StopThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (watcher_.joinable()) watcher_.join();
}

absl::Status Session::Detach() {
  StopThread();
  Current cur;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kAttached) cur = {session_id_, token_, generation_};
    state_ = State::kDetached;
    session_id_ = 0;
    token_.clear();
  }
  if (cur.session_id == 0) return absl::OkStatus();
  tutti::v1::DetachRequest request;
  cur.Name(&request);
  tutti::v1::DetachResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return FromGrpc(stub_->Detach(&ctx, request, &response));
}

SessionInfo Session::info() const {
  absl::MutexLock lock(&mu_);
  SessionInfo info;
  info.session_id = session_id_;
  info.namespace_id = attach_.namespace_id();
  info.generation = generation_;
  info.object_bytes = attach_.object_bytes();
  info.max_blocks_per_call = attach_.max_blocks_per_call();
  info.session_ttl_ms = attach_.session_ttl_ms();
  info.attached = state_ == State::kAttached;
  info.mode = request_.ready_words().count() > 0 ? MemoryMode::kCuda : MemoryMode::kHost;
  return info;
}

}  // namespace tutti::client::internal

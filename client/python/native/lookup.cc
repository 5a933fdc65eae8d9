// tutti._lookup: Lookups (and Releases) to several tuttids (a vLLM scheduler's TP ranks) from one
// Python call, through Debian's gRPC C++ library (libgrpc++), all in flight together and
// completed on the calling thread without the GIL.
//
// Why: grpcio's per-call cost (the hand-off to and from its polling thread, the Python objects of
// a call) was most of the scheduler's first get_num_new_matched_tokens of a long prompt, and
// most of its tail (issue 21 section 4, bench/results/vllm_lookup_latency.jsonl). Here a Lookup
// costs what the C++ client's does; the caller's thread polls the completion queue itself.
//
// Bytes in, bytes out: the request is a serialized tutti.v1.LookupRequest, the answer a
// serialized LookupResponse (tutti.client parses it with the generated Python module). This
// module links no protobuf (generic calls), so the Python protobuf runtime's descriptor pool never
// meets a second registration of kvcache.proto. grpcio bundles its own gRPC core; the one here is
// Debian's libgrpc.so, a separate copy with its own threads: Python loads extension modules with
// RTLD_LOCAL, so neither sees the other's symbols (tests: client_native_test).
//
// The lookup socket (issue 21 section 4): where tuttid serves one (<socket>.lookup,
// common/lookup_wire.h), a Lookup goes there instead, the same serialized request on a
// connection the channel keeps: no gRPC on either end. A channel connects to it at open and, when
// absent or refused, tries again at most once a second (RESOURCE_EXHAUSTED: every 5 s); until then
// its Lookups go through libgrpc++. A connection that ends before its answer is reported
// UNAVAILABLE (tutti.client asks again through grpcio, as for libgrpc++'s UNAVAILABLE) and
// dropped; one past its deadline is dropped too. One Lookup at a time per connection: a second
// thread's Lookup on a busy channel goes through libgrpc++.
//
// CPython's limited API (abi3, 3.8+). tutti.client uses it where it loads and falls back to
// grpcio where it does not (another platform, no libgrpc++ 1.51).
//
//   open(socket_path, lookup_socket=True) -> channel (a capsule; gRPC connects in the background,
//     at once; the lookup socket is tried now, unless lookup_socket is false)
//   lookup(calls) -> [(code, details, response bytes or None), ...]
//     calls: a list of (channel, request bytes, timeout_s); code: the gRPC status code (0: OK)
//   release(calls) -> as lookup, for ReleaseRequests (every rank's lease of a request at once)
//   state(channel, try_to_connect=False) -> the channel's connectivity (grpc_connectivity_state)
//   reconnect(channel): ends the channel's reconnect back-off (tuttid is back: connect now), and
//     drops its lookup socket connection, to be made again at the next Lookup
//   on_socket(channel) -> whether the channel's Lookups go to the lookup socket now
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/lookup_wire.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>

namespace {

const char kCapsule[] = "tutti._lookup.channel";
const char kLookup[] = "/tutti.v1.KvCache/Lookup";
const char kRelease[] = "/tutti.v1.KvCache/Release";

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Waits for `events` on `fd` until `deadline` (Now()); false past it or on a poll error.
bool WaitFor(int fd, short events, double deadline) {
  for (;;) {
    const double left = deadline - Now();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

bool WriteFull(int fd, const char* p, size_t n, double deadline) {
  while (n > 0) {
    const ssize_t sent = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent > 0) {
      p += sent;
      n -= static_cast<size_t>(sent);
    } else if (sent < 0 && errno == EINTR) {
      continue;
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// An answer frame being read (lookup_wire.h).
struct Reading {
  char header[tutti::kLookupHeaderBytes];
  size_t got = 0;  // of header, then header + body
  std::string body;
  // Reads what is there: 1 when the frame is whole, 0 for more to come, -1 when the connection
  // ended or the frame is too long.
  int Step(int fd) {
    for (;;) {
      char* p;
      size_t want;
      if (got < sizeof(header)) {
        p = header + got;
        want = sizeof(header) - got;
      } else {
        const size_t at = got - sizeof(header);
        if (at == body.size()) return 1;
        p = &body[at];
        want = body.size() - at;
      }
      const ssize_t n = recv(fd, p, want, MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<size_t>(n);
        if (got == sizeof(header)) {
          const uint32_t len = tutti::GetLookupU32(header);
          if (len > tutti::kMaxLookupResponse) return -1;
          body.resize(len);
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      return -1;
    }
  }
  uint32_t code() const { return tutti::GetLookupU32(header + 4); }
};

// The channel's connection to the lookup socket.
struct Fast {
  std::mutex mu;  // held for a whole Lookup on the connection
  std::string path;
  bool enabled = true;
  int fd = -1;
  double retry_at = 0;  // Now(): no connect before

  ~Fast() { Drop(0); }
  void Drop(double retry_in) {
    if (fd >= 0) close(fd);
    fd = -1;
    retry_at = Now() + retry_in;
  }
  // Connected and admitted (tuttid's empty OK frame) by `deadline`, or not (mu held).
  bool Ready(double deadline) {
    if (fd >= 0) return true;
    if (!enabled || Now() < retry_at) return false;
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) {
      enabled = false;
      return false;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      Drop(1);
      return false;
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    // A unix socket connects at once or fails (ENOENT: no lookup socket; EAGAIN: its backlog is
    // full): either way, gRPC this time.
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Drop(1);
      return false;
    }
    Reading hello;
    int r;
    while ((r = hello.Step(fd)) == 0) {
      if (!WaitFor(fd, POLLIN, deadline)) break;
    }
    if (r != 1 || hello.code() != 0) {
      Drop(r == 1 ? 5 : 1);  // refused (a limit): later; else tuttid is busy or going
      return false;
    }
    return true;
  }
};

struct Channel {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  Fast fast;
};

void FreeChannel(PyObject* capsule) {
  delete static_cast<Channel*>(PyCapsule_GetPointer(capsule, kCapsule));
}

Channel* ChannelOf(PyObject* capsule) {
  return static_cast<Channel*>(PyCapsule_GetPointer(capsule, kCapsule));  // sets TypeError
}

PyObject* Open(PyObject*, PyObject* args) {
  const char* path;
  int lookup_socket = 1;
  if (!PyArg_ParseTuple(args, "s|p", &path, &lookup_socket)) return nullptr;
  auto c = std::make_unique<Channel>();
  c->fast.path = tutti::LookupSocketPath(path);
  c->fast.enabled = lookup_socket != 0;
  Py_BEGIN_ALLOW_THREADS
  {
    std::lock_guard<std::mutex> lock(c->fast.mu);
    c->fast.Ready(Now() + 1.0);
  }
  grpc::ChannelArguments a;
  a.SetInt("grpc.initial_reconnect_backoff_ms", 100);
  a.SetInt("grpc.max_reconnect_backoff_ms", 1000);
  a.SetMaxReceiveMessageSize(64 << 20);
  // Its own connection, not one shared with grpcio's channel (another gRPC core anyway).
  a.SetInt("grpc.use_local_subchannel_pool", 1);
  c->channel = grpc::CreateCustomChannel(std::string("unix:") + path,
                                         grpc::InsecureChannelCredentials(), a);
  c->channel->GetState(/*try_to_connect=*/true);
  c->stub = std::make_unique<grpc::GenericStub>(c->channel);
  Py_END_ALLOW_THREADS
  PyObject* capsule = PyCapsule_New(c.get(), kCapsule, FreeChannel);
  if (capsule != nullptr) c.release();
  return capsule;
}

PyObject* State(PyObject*, PyObject* args) {
  PyObject* capsule;
  int connect = 0;
  if (!PyArg_ParseTuple(args, "O|p", &capsule, &connect)) return nullptr;
  Channel* c = ChannelOf(capsule);
  if (c == nullptr) return nullptr;
  return PyLong_FromLong(static_cast<long>(c->channel->GetState(connect != 0)));
}

PyObject* Reconnect(PyObject*, PyObject* args) {
  PyObject* capsule;
  if (!PyArg_ParseTuple(args, "O", &capsule)) return nullptr;
  Channel* c = ChannelOf(capsule);
  if (c == nullptr) return nullptr;
  grpc::experimental::ChannelResetConnectionBackoff(c->channel.get());
  c->channel->GetState(/*try_to_connect=*/true);
  Py_BEGIN_ALLOW_THREADS
  std::lock_guard<std::mutex> lock(c->fast.mu);  // waits for a Lookup of another thread
  c->fast.Drop(0);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* OnSocket(PyObject*, PyObject* args) {
  PyObject* capsule;
  if (!PyArg_ParseTuple(args, "O", &capsule)) return nullptr;
  Channel* c = ChannelOf(capsule);
  if (c == nullptr) return nullptr;
  bool on;
  Py_BEGIN_ALLOW_THREADS
  std::lock_guard<std::mutex> lock(c->fast.mu);
  on = c->fast.fd >= 0;
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(on);
}

struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  bool done = false;
  // On the lookup socket instead (then `reader` is null): the lock on its connection, the answer.
  std::unique_lock<std::mutex> fast;
  Reading reading;
  std::string flat;  // the answer's body when OK
};

// Sends call `i`'s request on its channel's lookup socket; false (nothing held) where it cannot:
// no socket, a busy one, or a send that failed (the connection is dropped; tuttid read no whole
// request, so gRPC may ask instead).
bool SendFast(Channel* channel, const char* data, size_t len, double deadline, Call* call) {
  std::unique_lock<std::mutex> lock(channel->fast.mu, std::try_to_lock);
  if (!lock.owns_lock() || !channel->fast.Ready(deadline)) return false;
  std::string frame(tutti::kLookupHeaderBytes, '\0');
  tutti::PutLookupU32(&frame[0], static_cast<uint32_t>(len));
  tutti::PutLookupU32(&frame[4], tutti::kLookupKind);
  frame.append(data, len);
  if (!WriteFull(channel->fast.fd, frame.data(), frame.size(), deadline)) {
    channel->fast.Drop(0);
    return false;
  }
  call->fast = std::move(lock);
  return true;
}

// Reads the answers of the calls sent on lookup sockets, all together, each by its deadline.
void ReceiveFast(const std::vector<Channel*>& channels, const std::vector<double>& deadlines,
                 std::vector<std::unique_ptr<Call>>& calls) {
  std::vector<size_t> waiting;
  for (size_t i = 0; i < calls.size(); i++) {
    if (calls[i]->fast.owns_lock()) waiting.push_back(i);
  }
  std::vector<pollfd> polls;
  while (!waiting.empty()) {
    std::vector<size_t> still;
    const double now = Now();
    double first_deadline = 1e300;
    for (size_t i : waiting) {
      Call& call = *calls[i];
      Fast& fast = channels[i]->fast;
      const int r = call.reading.Step(fast.fd);
      if (r == 1) {
        call.done = true;
        const int code = static_cast<int>(call.reading.code());
        if (code == 0) {
          call.flat = std::move(call.reading.body);
        } else {
          call.status = grpc::Status(static_cast<grpc::StatusCode>(code), call.reading.body);
        }
      } else if (r < 0) {
        call.done = true;
        call.status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "tuttid's lookup socket closed the connection");
        fast.Drop(0);
      } else if (now >= deadlines[i]) {
        call.done = true;
        call.status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
        fast.Drop(0);  // its answer may come later: this connection is out of step
      } else {
        still.push_back(i);
        first_deadline = std::min(first_deadline, deadlines[i]);
      }
    }
    waiting.swap(still);
    if (waiting.empty()) break;
    polls.clear();
    for (size_t i : waiting) polls.push_back({channels[i]->fast.fd, POLLIN, 0});
    const double left = first_deadline - Now();
    if (left > 0) (void)poll(polls.data(), polls.size(), static_cast<int>(left * 1000) + 1);
  }
  for (auto& call : calls) {
    if (call->fast.owns_lock()) call->fast.unlock();
  }
}

// Unary calls of `method` ("/tutti.v1.KvCache/Lookup"), one per (channel, request, timeout).
PyObject* Calls(const char* method, PyObject* list) {
  if (!PyList_Check(list)) {
    PyErr_SetString(PyExc_TypeError, "calls must be a list of (channel, bytes, timeout)");
    return nullptr;
  }
  const Py_ssize_t n = PyList_Size(list);
  std::vector<Channel*> channels(n);
  std::vector<grpc::ByteBuffer> requests(n);
  std::vector<std::string> raw(n);
  const bool lookup = std::strcmp(method, kLookup) == 0;
  std::vector<double> timeouts(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* triple = PyList_GetItem(list, i);  // borrowed
    PyObject *capsule, *bytes;
    if (triple == nullptr || !PyArg_ParseTuple(triple, "OOd", &capsule, &bytes, &timeouts[i])) {
      return nullptr;
    }
    if (!(timeouts[i] > 0) || timeouts[i] > 86400) {
      PyErr_Format(PyExc_ValueError, "a timeout must be in (0, 86400] s");
      return nullptr;
    }
    channels[i] = ChannelOf(capsule);
    if (channels[i] == nullptr) return nullptr;
    char* data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(bytes, &data, &len) < 0) return nullptr;
    raw[i].assign(data, static_cast<size_t>(len));  // a copy: no GIL needed past here
  }
  std::vector<std::unique_ptr<Call>> calls(n);
  Py_BEGIN_ALLOW_THREADS
  grpc::CompletionQueue cq;
  const auto now = std::chrono::system_clock::now();
  const double start = Now();
  std::vector<double> deadlines(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    calls[i] = std::make_unique<Call>();
    deadlines[i] = start + timeouts[i];
    if (lookup) SendFast(channels[i], raw[i].data(), raw[i].size(), deadlines[i], calls[i].get());
  }
  Py_ssize_t on_grpc = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    Call& call = *calls[i];
    if (call.fast.owns_lock()) continue;
    on_grpc++;
    grpc::Slice slice(raw[i].data(), raw[i].size());
    requests[i] = grpc::ByteBuffer(&slice, 1);
    call.ctx.set_deadline(now + std::chrono::microseconds(static_cast<int64_t>(timeouts[i] * 1e6)));
    call.reader = channels[i]->stub->PrepareUnaryCall(&call.ctx, method, requests[i], &cq);
    call.reader->StartCall();
    call.reader->Finish(&call.response, &call.status, reinterpret_cast<void*>(i));
  }
  ReceiveFast(channels, deadlines, calls);
  for (Py_ssize_t left = on_grpc; left > 0; left--) {
    void* tag;
    bool ok;
    if (!cq.Next(&tag, &ok)) break;  // never before every call finished: not shut down yet
    calls[reinterpret_cast<intptr_t>(tag)]->done = true;
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  Py_END_ALLOW_THREADS
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; i++) {
    Call& call = *calls[i];
    int code = call.done ? static_cast<int>(call.status.error_code())
                         : static_cast<int>(grpc::StatusCode::UNKNOWN);
    const std::string details =
        call.done ? call.status.error_message() : std::string("the call did not complete");
    std::string flat = std::move(call.flat);
    if (code == 0 && call.reader != nullptr) {
      std::vector<grpc::Slice> slices;
      if (!call.response.Dump(&slices).ok()) {
        code = static_cast<int>(grpc::StatusCode::INTERNAL);
      } else {
        size_t total = 0;
        for (const auto& s : slices) total += s.size();
        flat.reserve(total);
        for (const auto& s : slices) flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    PyObject* item;
    if (code == 0) {
      item = Py_BuildValue("(isy#)", code, "", flat.data(), static_cast<Py_ssize_t>(flat.size()));
    } else {
      // tuttid's message, whatever its bytes (never an exception here).
      PyObject* text = PyUnicode_DecodeUTF8(details.data(),
                                            static_cast<Py_ssize_t>(details.size()), "replace");
      item = text == nullptr ? nullptr : Py_BuildValue("(iNO)", code, text, Py_None);
    }
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SetItem(out, i, item);  // steals
  }
  return out;
}

PyObject* Lookup(PyObject*, PyObject* args) {
  PyObject* list;
  if (!PyArg_ParseTuple(args, "O", &list)) return nullptr;
  return Calls(kLookup, list);
}

PyObject* Release(PyObject*, PyObject* args) {
  PyObject* list;
  if (!PyArg_ParseTuple(args, "O", &list)) return nullptr;
  return Calls(kRelease, list);
}

PyMethodDef kMethods[] = {
    {"open", Open, METH_VARARGS,
     "open(socket_path, lookup_socket=True) -> a channel to tuttid at socket_path (gRPC connects "
     "in the background; Lookups use <socket_path>.lookup where tuttid serves it)"},
    {"on_socket", OnSocket, METH_VARARGS,
     "on_socket(channel) -> whether the channel's Lookups go to tuttid's lookup socket now"},
    {"lookup", Lookup, METH_VARARGS,
     "lookup([(channel, LookupRequest bytes, timeout_s), ...]) -> [(code, details, "
     "LookupResponse bytes or None), ...]: every call in flight at once, without the GIL"},
    {"release", Release, METH_VARARGS,
     "release([(channel, ReleaseRequest bytes, timeout_s), ...]) -> [(code, details, "
     "ReleaseResponse bytes or None), ...]: as lookup"},
    {"reconnect", Reconnect, METH_VARARGS,
     "reconnect(channel): connect now, not at the end of the reconnect back-off (and drop the "
     "lookup socket's connection, made again at the next Lookup)"},
    {"state", State, METH_VARARGS,
     "state(channel, try_to_connect=False) -> the channel's connectivity state (an int)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_lookup",
                       "Lookups to several tuttids at once through libgrpc++ (tutti.client).", -1,
                       kMethods};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__lookup(void) {
  return PyModule_Create(&kModule);
}

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
// CPython's limited API (abi3, 3.8+). tutti.client uses it where it loads and falls back to
// grpcio where it does not (another platform, no libgrpc++ 1.51).
//
//   open(socket_path) -> channel (a capsule; the connection is made in the background, at once)
//   lookup(calls) -> [(code, details, response bytes or None), ...]
//     calls: a list of (channel, request bytes, timeout_s); code: the gRPC status code (0: OK)
//   release(calls) -> as lookup, for ReleaseRequests (every rank's lease of a request at once)
//   state(channel, try_to_connect=False) -> the channel's connectivity (grpc_connectivity_state)
//   reconnect(channel): ends the channel's reconnect back-off (tuttid is back: connect now)
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

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

struct Channel {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
};

void FreeChannel(PyObject* capsule) {
  delete static_cast<Channel*>(PyCapsule_GetPointer(capsule, kCapsule));
}

Channel* ChannelOf(PyObject* capsule) {
  return static_cast<Channel*>(PyCapsule_GetPointer(capsule, kCapsule));  // sets TypeError
}

PyObject* Open(PyObject*, PyObject* args) {
  const char* path;
  if (!PyArg_ParseTuple(args, "s", &path)) return nullptr;
  auto c = std::make_unique<Channel>();
  Py_BEGIN_ALLOW_THREADS
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
  Py_RETURN_NONE;
}

struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  bool done = false;
};

// Unary calls of `method` ("/tutti.v1.KvCache/Lookup"), one per (channel, request, timeout).
PyObject* Calls(const char* method, PyObject* list) {
  if (!PyList_Check(list)) {
    PyErr_SetString(PyExc_TypeError, "calls must be a list of (channel, bytes, timeout)");
    return nullptr;
  }
  const Py_ssize_t n = PyList_Size(list);
  std::vector<Channel*> channels(n);
  std::vector<grpc::ByteBuffer> requests(n);
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
    grpc::Slice slice(data, static_cast<size_t>(len));  // a copy: no GIL needed past here
    requests[i] = grpc::ByteBuffer(&slice, 1);
  }
  std::vector<std::unique_ptr<Call>> calls(n);
  Py_BEGIN_ALLOW_THREADS
  grpc::CompletionQueue cq;
  const auto now = std::chrono::system_clock::now();
  for (Py_ssize_t i = 0; i < n; i++) {
    calls[i] = std::make_unique<Call>();
    Call& call = *calls[i];
    call.ctx.set_deadline(now + std::chrono::microseconds(static_cast<int64_t>(timeouts[i] * 1e6)));
    call.reader = channels[i]->stub->PrepareUnaryCall(&call.ctx, method, requests[i], &cq);
    call.reader->StartCall();
    call.reader->Finish(&call.response, &call.status, reinterpret_cast<void*>(i));
  }
  for (Py_ssize_t left = n; left > 0; left--) {
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
    std::string flat;
    if (code == 0) {
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
     "open(socket_path) -> a channel to tuttid at socket_path (connects in the background)"},
    {"lookup", Lookup, METH_VARARGS,
     "lookup([(channel, LookupRequest bytes, timeout_s), ...]) -> [(code, details, "
     "LookupResponse bytes or None), ...]: every call in flight at once, without the GIL"},
    {"release", Release, METH_VARARGS,
     "release([(channel, ReleaseRequest bytes, timeout_s), ...]) -> [(code, details, "
     "ReleaseResponse bytes or None), ...]: as lookup"},
    {"reconnect", Reconnect, METH_VARARGS,
     "reconnect(channel): connect now, not at the end of the reconnect back-off"},
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

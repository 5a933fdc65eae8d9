#include "daemon/io/cufile_api.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace tutti::io::cufile {
namespace {

struct CodeEntry {
  int code;
  const char* name;
};

// CUfileOpError, as in cufile.h.
constexpr CodeEntry kCodes[] = {
    {0, "CU_FILE_SUCCESS"},
    {5001, "CU_FILE_DRIVER_NOT_INITIALIZED"},
    {5002, "CU_FILE_DRIVER_INVALID_PROPS"},
    {5003, "CU_FILE_DRIVER_UNSUPPORTED_LIMIT"},
    {5004, "CU_FILE_DRIVER_VERSION_MISMATCH"},
    {5005, "CU_FILE_DRIVER_VERSION_READ_ERROR"},
    {5006, "CU_FILE_DRIVER_CLOSING"},
    {5007, "CU_FILE_PLATFORM_NOT_SUPPORTED"},
    {5008, "CU_FILE_IO_NOT_SUPPORTED"},
    {5009, "CU_FILE_DEVICE_NOT_SUPPORTED"},
    {5010, "CU_FILE_NVFS_DRIVER_ERROR"},
    {5011, "CU_FILE_CUDA_DRIVER_ERROR"},
    {5012, "CU_FILE_CUDA_POINTER_INVALID"},
    {5013, "CU_FILE_CUDA_MEMORY_TYPE_INVALID"},
    {5014, "CU_FILE_CUDA_POINTER_RANGE_ERROR"},
    {5015, "CU_FILE_CUDA_CONTEXT_MISMATCH"},
    {5016, "CU_FILE_INVALID_MAPPING_SIZE"},
    {5017, "CU_FILE_INVALID_MAPPING_RANGE"},
    {5018, "CU_FILE_INVALID_FILE_TYPE"},
    {5019, "CU_FILE_INVALID_FILE_OPEN_FLAG"},
    {5020, "CU_FILE_DIO_NOT_SET"},
    {5022, "CU_FILE_INVALID_VALUE"},
    {5023, "CU_FILE_MEMORY_ALREADY_REGISTERED"},
    {5024, "CU_FILE_MEMORY_NOT_REGISTERED"},
    {5025, "CU_FILE_PERMISSION_DENIED"},
    {5026, "CU_FILE_DRIVER_ALREADY_OPEN"},
    {5027, "CU_FILE_HANDLE_NOT_REGISTERED"},
    {5028, "CU_FILE_HANDLE_ALREADY_REGISTERED"},
    {5029, "CU_FILE_DEVICE_NOT_FOUND"},
    {5030, "CU_FILE_INTERNAL_ERROR"},
    {5031, "CU_FILE_GETNEWFD_FAILED"},
    {5033, "CU_FILE_NVFS_SETUP_ERROR"},
    {5034, "CU_FILE_IO_DISABLED"},
    {5035, "CU_FILE_BATCH_SUBMIT_FAILED"},
    {5036, "CU_FILE_GPU_MEMORY_PINNING_FAILED"},
    {5037, "CU_FILE_BATCH_FULL"},
    {5038, "CU_FILE_ASYNC_NOT_SUPPORTED"},
    {5039, "CU_FILE_INTERNAL_BATCH_SETUP_ERROR"},
    {5040, "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR"},
    {5041, "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR"},
    {5042, "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR"},
    {5043, "CU_FILE_NOMEM_ERROR"},
    {5044, "CU_FILE_IO_ERROR"},
    {5045, "CU_FILE_INTERNAL_BUF_REGISTER_ERROR"},
    {5046, "CU_FILE_HASH_OPR_ERROR"},
    {5047, "CU_FILE_INVALID_CONTEXT_ERROR"},
    {5048, "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR"},
    {5049, "CU_FILE_BATCH_NOCOMPAT_ERROR"},
};

constexpr const char* kDefaultNames[] = {"libcufile.so.0", "libcufile.so"};

}  // namespace

std::string CodeName(int code) {
  for (const CodeEntry& e : kCodes) {
    if (e.code == code) return e.name;
  }
  return absl::StrCat("cuFile error ", code);
}

std::string ErrorText(const Error& e) {
  std::string text = absl::StrCat(CodeName(e.err), " (", e.err);
  if (e.err == 5011) absl::StrAppend(&text, ", CUresult ", e.cu_err);
  return absl::StrCat(text, ")");
}

absl::StatusOr<std::unique_ptr<CuFileLibrary>> CuFileLibrary::Load(const std::string& path) {
  std::string tried;
  auto try_open = [&](const char* name) -> void* {
    void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
    }
    return h;
  };
  std::unique_ptr<CuFileLibrary> lib;
  if (!path.empty()) {
    if (void* h = try_open(path.c_str())) lib.reset(new CuFileLibrary(h, path));
  } else {
    for (const char* name : kDefaultNames) {
      if (void* h = try_open(name)) {
        lib.reset(new CuFileLibrary(h, name));
        break;
      }
    }
  }
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("libcufile not loaded: ", tried));
  absl::Status resolved = lib->Resolve();
  if (!resolved.ok()) return resolved;
  return lib;
}

absl::Status CuFileLibrary::Resolve() {
  std::string missing;
  auto sym = [&](auto* fn, const char* name, const char* alt = nullptr) {
    void* p = dlsym(handle_, name);
    if (p == nullptr && alt != nullptr) p = dlsym(handle_, alt);
    if (p == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  sym(&api_.driver_open, "cuFileDriverOpen");
  sym(&api_.driver_close, "cuFileDriverClose_v2", "cuFileDriverClose");
  sym(&api_.handle_register, "cuFileHandleRegister");
  sym(&api_.handle_deregister, "cuFileHandleDeregister");
  sym(&api_.buf_register, "cuFileBufRegister");
  sym(&api_.buf_deregister, "cuFileBufDeregister");
  sym(&api_.read, "cuFileRead");
  sym(&api_.write, "cuFileWrite");
  if (missing.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(path_, " lacks the cuFile entry points ", missing, " (not libcufile?)"));
}

CuFileLibrary::~CuFileLibrary() { dlclose(handle_); }

}  // namespace tutti::io::cufile

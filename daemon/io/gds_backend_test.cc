// The "gds" backend against the fake libcufile (daemon/io/testing/fake_cufile.h): bytes round trip
// through cuFile into "GPU" staging, reads go before writes, cuFile errors complete requests, and
// each detection failure makes OpenIoBackend fall back to uring with the reason (or refuse, for
// io.fallback "fail").
#include "daemon/io/gds_backend.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/io_factory.h"
#include "daemon/io/test_util.h"
#include "daemon/io/testing/fake_cufile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kFileBytes = 1 << 20;
constexpr const char* kSwitches[] = {"FAKE_CUFILE_FAIL_DRIVER_OPEN",
                                     "FAKE_CUFILE_FAIL_HANDLE_REGISTER",
                                     "FAKE_CUFILE_FAIL_BUF_REGISTER", "FAKE_CUFILE_FAIL_READ"};

// The fake library's absolute path in the runfiles ($FAKE_CUFILE overrides).
std::string FakePath() {
  if (const char* p = getenv("FAKE_CUFILE")) return p;
  char buf[PATH_MAX];
  const char* rel = "daemon/io/testing/libfake_cufile.so";
  return realpath(rel, buf) != nullptr ? std::string(buf) : std::string(rel);
}

FakeCuFileStats Stats() {
  void* h = dlopen(FakePath().c_str(), RTLD_NOW | RTLD_NOLOAD);
  FakeCuFileStats s{};
  if (h == nullptr) return s;  // not loaded: nothing happened
  auto fn = reinterpret_cast<void (*)(FakeCuFileStats*)>(dlsym(h, "fake_cufile_stats"));
  if (fn != nullptr) fn(&s);
  dlclose(h);
  return s;
}

class GdsBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* s : kSwitches) unsetenv(s);
    std::string why;
    dir_ = testing::MakeODirectDir("gds", &why);
    if (dir_.empty()) GTEST_SKIP() << why;
    options_.gds.library = FakePath();
    options_.gds.gpu_staging = true;
  }
  void TearDown() override {
    for (const char* s : kSwitches) unsetenv(s);
    if (!dir_.empty()) testing::RemoveTree(dir_);
  }

  // `n` fresh pool files of kFileBytes, opened O_DIRECT.
  std::vector<int> OpenFiles(int n) {
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) {
      const std::string path = absl::StrCat(dir_, "/f", i, "_", next_++);
      const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
      EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
      EXPECT_EQ(ftruncate(fd, kFileBytes), 0);
      fds.push_back(fd);
    }
    return fds;
  }

  OpenedBackend Open(std::vector<int> fds) {
    auto opened = OpenIoBackend("gds", std::move(fds), {kFileBytes, kFileBytes}, options_);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? *std::move(opened) : OpenedBackend{};
  }

  // Writes a pattern at (file, offset) from `buf`, reads it back into `back`; expects equality.
  static void RoundTrip(IoBackend* b, uint32_t file, uint64_t offset, uint8_t* buf, uint8_t* back,
                        uint32_t len, uint8_t seed) {
    for (uint32_t i = 0; i < len; ++i) buf[i] = static_cast<uint8_t>(seed + i * 7);
    IoRequest w{Op::kWrite, file, offset, buf, len};
    b->Execute(absl::MakeSpan(&w, 1));
    ASSERT_EQ(w.result, len);
    std::memset(back, 0, len);
    IoRequest r{Op::kRead, file, offset, back, len};
    b->Execute(absl::MakeSpan(&r, 1));
    ASSERT_EQ(r.result, len);
    EXPECT_EQ(std::memcmp(buf, back, len), 0);
  }

  std::string dir_;
  IoOptions options_;
  int next_ = 0;
};

TEST_F(GdsBackendTest, BytesRoundTripThroughTheRegisteredStagingAndReachTheFiles) {
  std::vector<int> fds = OpenFiles(2);
  const int fd1 = fds[1];
  OpenedBackend o = Open(fds);
  ASSERT_NE(o.backend, nullptr);
  EXPECT_EQ(o.backend->name(), "gds");
  EXPECT_EQ(o.choice.backend, "gds");
  EXPECT_EQ(o.choice.requested, "gds");
  EXPECT_EQ(o.choice.reason, "");
  EXPECT_EQ(Stats().handles, 2);
  AlignedBuffer staging(64 << 10);
  ASSERT_TRUE(o.backend->RegisterBuffer(staging.span()).ok());
  EXPECT_EQ(Stats().buffers, 1);
  RoundTrip(o.backend.get(), 1, 8192, staging.data(), staging.data() + (32 << 10), 16 << 10, 3);
  // The bytes are in the file itself.
  AlignedBuffer disk(16 << 10);
  ASSERT_EQ(pread(fd1, disk.data(), 16 << 10, 8192), 16 << 10);
  EXPECT_EQ(std::memcmp(disk.data(), staging.data(), 16 << 10), 0);
  auto* gds = static_cast<GdsBackend*>(o.backend.get());
  EXPECT_EQ(gds->counters().registered_buffer_ops, 2u);
  EXPECT_EQ(gds->counters().plain_buffer_ops, 0u);
  EXPECT_TRUE(o.backend->Sync(1).ok());
  o.backend.reset();  // everything cuFile was given is handed back
  const FakeCuFileStats after = Stats();
  EXPECT_EQ(after.handles, 0);
  EXPECT_EQ(after.buffers, 0);
  EXPECT_EQ(after.driver_open, 0);
}

TEST_F(GdsBackendTest, BuffersOutsideTheRegionGoAsTheirOwnBase) {
  OpenedBackend o = Open(OpenFiles(2));
  ASSERT_NE(o.backend, nullptr);
  AlignedBuffer a(8192), b(8192);
  RoundTrip(o.backend.get(), 0, 0, a.data(), b.data(), 8192, 9);
  EXPECT_EQ(static_cast<GdsBackend*>(o.backend.get())->counters().plain_buffer_ops, 2u);
}

TEST_F(GdsBackendTest, RequestsOfAFileGoInArrivalOrder) {
  OpenedBackend o = Open(OpenFiles(2));
  ASSERT_NE(o.backend, nullptr);
  AlignedBuffer old_data(4096), new_data(4096), back(4096);
  std::memset(old_data.data(), 'o', 4096);
  std::memset(new_data.data(), 'n', 4096);
  IoRequest first{Op::kWrite, 0, 0, old_data.data(), 4096};
  o.backend->Execute(absl::MakeSpan(&first, 1));
  ASSERT_EQ(first.result, 4096);
  IoRequest batch[2] = {{Op::kWrite, 0, 0, new_data.data(), 4096},
                        {Op::kRead, 0, 0, back.data(), 4096}};
  o.backend->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(batch[0].result, 4096);
  EXPECT_EQ(batch[1].result, 4096);
  EXPECT_EQ(back.data()[0], 'n');  // the read was issued after the write queued ahead of it
}

TEST_F(GdsBackendTest, InvalidRequestsCompleteWithEinvalAndDoneStillRuns) {
  OpenedBackend o = Open(OpenFiles(2));
  ASSERT_NE(o.backend, nullptr);
  AlignedBuffer buf(8192);
  IoRequest bad[3] = {{Op::kRead, 2, 0, buf.data(), 4096},            // no such file
                      {Op::kRead, 0, 100, buf.data(), 4096},          // unaligned
                      {Op::kRead, 0, kFileBytes, buf.data(), 4096}};  // past the end
  o.backend->Execute(absl::MakeSpan(bad));
  for (const IoRequest& r : bad) EXPECT_EQ(r.result, -EINVAL);
}

TEST_F(GdsBackendTest, ACuFileReadErrorFailsThatRequestOnly) {
  OpenedBackend o = Open(OpenFiles(2));
  ASSERT_NE(o.backend, nullptr);
  AlignedBuffer buf(3 * 4096);
  setenv("FAKE_CUFILE_FAIL_READ", "4096:5044", 1);  // CU_FILE_IO_ERROR
  IoRequest reqs[2] = {{Op::kRead, 0, 0, buf.data(), 4096},
                       {Op::kRead, 0, 4096, buf.data() + 4096, 4096}};
  o.backend->Execute(absl::MakeSpan(reqs));
  EXPECT_EQ(reqs[0].result, 4096);
  EXPECT_EQ(reqs[1].result, -EIO);
  setenv("FAKE_CUFILE_FAIL_READ", "8192:61", 1);  // a file system error: -1 with errno ENODATA
  IoRequest r{Op::kRead, 1, 8192, buf.data() + 8192, 4096};
  o.backend->Execute(absl::MakeSpan(&r, 1));
  EXPECT_EQ(r.result, -ENODATA);
  EXPECT_EQ(static_cast<GdsBackend*>(o.backend.get())->counters().cufile_errors, 2u);
}

TEST_F(GdsBackendTest, ARefusedBufferRegistrationLeavesTheBackendUsable) {
  OpenedBackend o = Open(OpenFiles(2));
  ASSERT_NE(o.backend, nullptr);
  AlignedBuffer staging(16384);
  setenv("FAKE_CUFILE_FAIL_BUF_REGISTER", "5036", 1);
  absl::Status s = o.backend->RegisterBuffer(staging.span());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("CU_FILE_GPU_MEMORY_PINNING_FAILED (5036)"));
  RoundTrip(o.backend.get(), 0, 0, staging.data(), staging.data() + 8192, 8192, 1);
  unsetenv("FAKE_CUFILE_FAIL_BUF_REGISTER");
  EXPECT_TRUE(o.backend->RegisterBuffer(staging.span()).ok());  // may be retried
  EXPECT_EQ(o.backend->RegisterBuffer(staging.span()).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Each way detection fails: the fallback runs uring over the same files, with the reason.
struct FallbackCase {
  const char* name;
  const char* env;    // switch to set, or null
  const char* value;
  const char* library;  // null: the fake
  bool gpu_staging;
  const char* reason;  // expected in choice.reason
};

class GdsFallbackTest : public GdsBackendTest,
                        public ::testing::WithParamInterface<FallbackCase> {};

TEST_P(GdsFallbackTest, FallsBackToUringWithTheReason) {
  const FallbackCase& c = GetParam();
  if (c.env != nullptr) setenv(c.env, c.value, 1);
  if (c.library != nullptr) options_.gds.library = c.library;
  options_.gds.gpu_staging = c.gpu_staging;
  OpenedBackend o = Open(OpenFiles(2));
  ASSERT_NE(o.backend, nullptr);
  EXPECT_EQ(o.backend->name(), "uring");
  EXPECT_EQ(o.choice.backend, "uring");
  EXPECT_EQ(o.choice.requested, "gds");
  EXPECT_TRUE(o.choice.fell_back());
  EXPECT_THAT(o.choice.reason, HasSubstr(c.reason));
  EXPECT_EQ(o.choice.reason.rfind("gds: ", 0), 0u) << o.choice.reason;
  // The files came back to uring open and usable; cuFile holds nothing.
  AlignedBuffer a(8192), b(8192);
  RoundTrip(o.backend.get(), 1, 4096, a.data(), b.data(), 8192, 5);
  const FakeCuFileStats s = Stats();
  EXPECT_EQ(s.handles, 0);
  EXPECT_EQ(s.driver_open, 0);
}

TEST_P(GdsFallbackTest, FallbackFailRefusesNamingTheReason) {
  const FallbackCase& c = GetParam();
  if (c.env != nullptr) setenv(c.env, c.value, 1);
  if (c.library != nullptr) options_.gds.library = c.library;
  options_.gds.gpu_staging = c.gpu_staging;
  options_.fallback = "fail";
  auto opened = OpenIoBackend("gds", OpenFiles(2), {kFileBytes, kFileBytes}, options_);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("io.fallback is \"fail\""));
  EXPECT_THAT(opened.status().message(), HasSubstr(c.reason));
}

INSTANTIATE_TEST_SUITE_P(
    Detection, GdsFallbackTest,
    ::testing::Values(
        FallbackCase{"HostMode", nullptr, nullptr, nullptr, false, "gds: host mode"},
        FallbackCase{"NoLibrary", nullptr, nullptr, "/nonexistent/libcufile.so.0", true,
                     "libcufile not loaded: /nonexistent/libcufile.so.0"},
        FallbackCase{"NotCuFile", nullptr, nullptr, "libm.so.6", true,
                     "lacks the cuFile entry points cuFileDriverOpen"},
        FallbackCase{"DriverOpenFails", "FAKE_CUFILE_FAIL_DRIVER_OPEN", "5007", nullptr, true,
                     "gds: cuFileDriverOpen: CU_FILE_PLATFORM_NOT_SUPPORTED (5007)"},
        FallbackCase{"HandleRegisterFails", "FAKE_CUFILE_FAIL_HANDLE_REGISTER", "5027", nullptr,
                     true,
                     "gds: cuFileHandleRegister(pool file 0): CU_FILE_HANDLE_NOT_REGISTERED "
                     "(5027)"}),
    [](const ::testing::TestParamInfo<FallbackCase>& info) { return info.param.name; });

TEST_F(GdsBackendTest, OtherErrorsDoNotFallBack) {
  options_.fallback = "sideways";
  auto bad = OpenIoBackend("gds", OpenFiles(2), {kFileBytes, kFileBytes}, options_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("io.fallback"));
  options_.fallback = "uring";
  // A pool file that does not match its layout is an error, not a reason to fall back.
  auto wrong = OpenIoBackend("gds", OpenFiles(2), {kFileBytes, 2 * kFileBytes}, options_);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tutti::io

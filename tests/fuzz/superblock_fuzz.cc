// Fuzz target: superblock decoding, through pool::OpenOrCreatePool over a one-file pool whose first
// 4 KiB are the input (as given, then with the checksum re-sealed). The file is sparse, sized as
// the layout expects. Opening either succeeds with the layout's pool or is refused with
// FAILED_PRECONDITION or DATA_LOSS and a message; the fuzz file is never replaced.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/pool_files.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr size_t kPage = 4096;

const tutti::pool::PoolLayout& Layout() {
  static const tutti::pool::PoolLayout layout = [] {
    auto l = tutti::pool::PoolLayout::Compute(64ull << 20, 1, 4096, 8);
    if (!l.ok()) abort();
    return *l;
  }();
  return layout;
}

void OpenWith(const std::vector<uint8_t>& page) {
  const std::string& dir = tutti::fuzz::ScratchDir();
  tutti::fuzz::ClearDir(dir);
  const std::string path = dir + "/" + tutti::pool::kPoolFileName;
  tutti::fuzz::WriteFileOrDie(path, std::string(page.begin(), page.end()));
  if (truncate(path.c_str(), static_cast<off_t>(Layout().file_bytes())) != 0) abort();
  absl::StatusOr<tutti::pool::PoolFiles> pool =
      tutti::pool::OpenOrCreatePool({dir}, Layout(), nullptr, absl::ZeroDuration());
  if (pool.ok()) {
    if (pool->created || pool->fds.size() != 1) abort();
    return;
  }
  const absl::StatusCode code = pool.status().code();
  if (code == absl::StatusCode::kFailedPrecondition &&
      pool.status().message().find("O_DIRECT") != std::string::npos) {
    std::fprintf(stderr, "%s: the scratch filesystem lacks O_DIRECT\n", dir.c_str());
    abort();
  }
  if ((code != absl::StatusCode::kFailedPrecondition && code != absl::StatusCode::kDataLoss) ||
      pool.status().message().empty()) {
    std::fprintf(stderr, "refused oddly: %s\n", pool.status().ToString().c_str());
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = tutti::log::SetLevel("error");
  (void)quiet;
  std::vector<uint8_t> page(kPage, 0);
  std::memcpy(page.data(), data, std::min(size, kPage));
  OpenWith(page);
  tutti::fuzz::SealSuperblock(page.data());
  OpenWith(page);
  return 0;
}

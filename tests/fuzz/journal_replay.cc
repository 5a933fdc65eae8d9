#include "tests/fuzz/journal_replay.h"

#include <cstdio>
#include <cstdlib>

#include "common/log.h"
#include "daemon/store/journal.h"
#include "tests/fuzz/fuzz_util.h"

namespace tutti::fuzz {
namespace {

// Replays the state in `dir`; returns the number of records seen, or -1 if Open refused.
int64_t Replay(const std::string& dir) {
  int64_t seen = 0;
  store::RecoveryVisitor visitor;
  visitor.on_namespace = [&](const store::NamespaceRecord&) { ++seen; };
  visitor.on_put = [&](const store::PutRecord&) { ++seen; };
  visitor.on_delete = [&](const store::DeleteRecord&) { ++seen; };
  store::RecoveryReport report;
  absl::StatusOr<std::unique_ptr<store::Journal>> journal =
      store::Journal::Open(dir, visitor, &report);
  if (journal.ok()) return seen;
  const absl::StatusCode code = journal.status().code();
  if ((code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kFailedPrecondition &&
       code != absl::StatusCode::kInternal) ||
      journal.status().message().empty()) {
    std::fprintf(stderr, "replay refused oddly: %s\n", journal.status().ToString().c_str());
    abort();
  }
  return -1;
}

void ReplayOnce(const std::string& file_name, const std::string& bytes) {
  static const bool quiet = log::SetLevel("error");
  (void)quiet;
  const std::string& dir = ScratchDir();
  ClearDir(dir);
  WriteFileOrDie(dir + "/" + file_name, bytes);
  const int64_t first = Replay(dir);
  if (first < 0) return;
  const int64_t second = Replay(dir);
  if (second != first) {
    std::fprintf(stderr, "replay is not repeatable: %lld records, then %lld\n",
                 static_cast<long long>(first), static_cast<long long>(second));
    abort();
  }
}

}  // namespace

void ReplayAsStateFile(const std::string& file_name, const uint8_t* data, size_t size) {
  ReplayOnce(file_name, std::string(reinterpret_cast<const char*>(data), size));
  ReplayOnce(file_name, SealJournalRecords(data, size));
}

}  // namespace tutti::fuzz

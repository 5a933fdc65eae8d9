// The pieces every benchmark uses to append its results to bench/results/*.jsonl: a JSON string
// literal and the UTC timestamp written in each line's "date".
#ifndef TUTTI_BENCH_JSONL_H_
#define TUTTI_BENCH_JSONL_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tutti::bench {

// `s` as a JSON string literal, quotes included (the benchmarks' strings hold no control
// characters: only '"' and '\' are escaped).
inline std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Now, as 2026-11-29T15:02:12Z.
inline std::string UtcNow() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace tutti::bench

#endif  // TUTTI_BENCH_JSONL_H_

// What every benchmark uses to append its results to bench/results/*.jsonl: one line per result
// with bench, metric, value, unit, baseline_name, baseline_value, ratio (null without a baseline
// measured in the same run), an optional detail, machine, date and command.
#ifndef TUTTI_BENCH_JSONL_H_
#define TUTTI_BENCH_JSONL_H_

#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tutti::bench {

// One measured figure.
struct Result {
  std::string metric;
  double value = 0;
  std::string unit;
  std::string baseline_name;  // empty: no baseline (baseline_value and ratio are written null)
  double baseline_value = 0;
  std::optional<std::string> detail;  // written after the ratio when set
};

// `s` as a JSON string literal, quotes included.
inline std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Now, as 2026-11-29T15:02:12Z.
inline std::string UtcNow() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

// The command line as run, for the "command" field.
inline std::string CommandLine(int argc, char** argv) {
  return absl::StrJoin(argv, argv + argc, " ");
}

// The results line for `r` (no newline).
inline std::string JsonLine(absl::string_view bench, const Result& r, absl::string_view machine,
                            absl::string_view date, absl::string_view command) {
  const bool base = !r.baseline_name.empty();
  std::ostringstream out;
  out << "{\"bench\":" << JsonString(bench) << ",\"metric\":" << JsonString(r.metric)
      << ",\"value\":" << r.value << ",\"unit\":" << JsonString(r.unit)
      << ",\"baseline_name\":" << (base ? JsonString(r.baseline_name) : "null")
      << ",\"baseline_value\":" << (base ? absl::StrCat(r.baseline_value) : "null")
      << ",\"ratio\":" << (base ? absl::StrCat(r.value / r.baseline_value) : "null");
  if (r.detail.has_value()) out << ",\"detail\":" << JsonString(*r.detail);
  out << ",\"machine\":" << JsonString(machine) << ",\"date\":" << JsonString(date)
      << ",\"command\":" << JsonString(command) << "}";
  return out.str();
}

}  // namespace tutti::bench

#endif  // TUTTI_BENCH_JSONL_H_

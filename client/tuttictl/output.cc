#include "client/tuttictl/output.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti::tuttictl {

Table::Table(std::vector<std::string> headers) {
  for (std::string& h : headers) {
    const bool right = !h.empty() && h[0] == '>';
    right_.push_back(right);
    headers_.push_back(right ? h.substr(1) : h);
  }
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    width[c] = headers_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) text += "  ";
      const bool last = c + 1 == cells.size();
      if (right_[c]) {
        absl::StrAppendFormat(&text, "%*s", width[c], cells[c]);
      } else {
        absl::StrAppendFormat(&text, "%-*s", last ? 0 : width[c], cells[c]);
      }
    }
    out += text + "\n";
  };
  line(headers_);
  for (const auto& row : rows_) line(row);
  return out;
}

void KeyValues::Add(const std::string& key, const std::string& value) {
  items_.emplace_back(key, value);
}

std::string KeyValues::Render() const {
  size_t width = 0;
  for (const auto& [k, v] : items_) width = std::max(width, k.size());
  std::string out;
  for (const auto& [k, v] : items_) absl::StrAppendFormat(&out, "%-*s  %s\n", width, k, v);
  return out;
}

void JsonWriter::Separator() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ",";
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  Separator();
  out_ += "{";
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::EndObject() {
  out_ += "}";
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::BeginArray() {
  Separator();
  out_ += "[";
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::EndArray() {
  out_ += "]";
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::Key(const std::string& key) {
  String(key);
  out_ += ":";
  after_key_ = true;
  return *this;
}
JsonWriter& JsonWriter::String(const std::string& value) {
  Separator();
  out_ += "\"";
  for (unsigned char c : value) {
    switch (c) {
      case '"':
        out_ += "\\\"";
        break;
      case '\\':
        out_ += "\\\\";
        break;
      case '\n':
        out_ += "\\n";
        break;
      case '\t':
        out_ += "\\t";
        break;
      case '\r':
        out_ += "\\r";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out_, "\\u%04x", c);
        } else {
          out_ += static_cast<char>(c);
        }
    }
  }
  out_ += "\"";
  return *this;
}
JsonWriter& JsonWriter::Uint(uint64_t value) {
  Separator();
  absl::StrAppend(&out_, value);
  return *this;
}
JsonWriter& JsonWriter::Double(double value) {
  Separator();
  if (std::isfinite(value)) {
    absl::StrAppendFormat(&out_, "%.6g", value);
  } else {
    out_ += "null";
  }
  return *this;
}
JsonWriter& JsonWriter::Bool(bool value) {
  Separator();
  out_ += value ? "true" : "false";
  return *this;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = bytes / 1024.0;
  int unit = 0;
  while (v >= 1023.95 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string HumanDurationMs(uint64_t ms) {
  if (ms < 1000) return absl::StrCat(ms, "ms");
  if (ms < 60000) return absl::StrFormat("%.1fs", ms / 1000.0);
  const uint64_t s = ms / 1000;
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%dd%02dh%02dm", s / 86400, s / 3600 % 24, s / 60 % 60);
}

std::string Percent(uint64_t num, uint64_t den) {
  if (den == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * num / den);
}

std::string NamespaceHex(uint64_t id) { return absl::StrFormat("0x%016x", id); }

}  // namespace tutti::tuttictl

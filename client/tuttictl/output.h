// tuttictl's two output forms: aligned tables for people, JSON for scripts.
//
// Thread-safety: plain value types.
#ifndef TUTTI_CLIENT_TUTTICTL_OUTPUT_H_
#define TUTTI_CLIENT_TUTTICTL_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tutti::tuttictl {

// Rows of cells printed with each column padded to its widest cell. Columns whose header is
// marked numeric (a leading '>' in the header text, which is not printed) are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  void AddRow(std::vector<std::string> cells);  // missing cells print empty
  std::string Render() const;                   // one line per row, header first

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// "name   value" lines with the names padded to one width.
class KeyValues {
 public:
  void Add(const std::string& key, const std::string& value);
  std::string Render() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// Builds compact JSON text. Callers nest Begin/End calls correctly; keys are given before values
// inside objects.
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(const std::string& key);
  JsonWriter& String(const std::string& value);
  JsonWriter& Uint(uint64_t value);
  JsonWriter& Double(double value);  // non-finite values print as null
  JsonWriter& Bool(bool value);
  const std::string& str() const { return out_; }

 private:
  void Separator();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

// 1536 -> "1.5 KiB"; below 1 KiB "N B".
std::string HumanBytes(uint64_t bytes);
// 3723004 ms -> "1h02m03s"; below a minute "12.3s"; below a second "45ms".
std::string HumanDurationMs(uint64_t ms);
// 0.123 -> "12.3%"; den 0 -> "-".
std::string Percent(uint64_t num, uint64_t den);
// A namespace id as tuttictl shows and accepts it: "0x" and 16 hex digits.
std::string NamespaceHex(uint64_t id);

}  // namespace tutti::tuttictl

#endif  // TUTTI_CLIENT_TUTTICTL_OUTPUT_H_

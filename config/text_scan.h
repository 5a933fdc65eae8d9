// Internal to config/: a second, structural look at a text-format config, for what protobuf's
// TextFormat parser does not say: which field a parse error is in, and whether a non-repeated
// field is given more than once (the parser's Merge keeps the last value silently).
//
// Thread-safety: pure functions.
#ifndef TUTTI_CONFIG_TEXT_SCAN_H_
#define TUTTI_CONFIG_TEXT_SCAN_H_

#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/descriptor.h"

namespace tutti::config::internal {

// One field name in the text: its path ("limits.store_staging_bytes", "pool.dirs[1]") and where
// the name starts (0-based line and column, as protobuf's tokenizer counts them).
struct FieldMention {
  std::string path;
  bool repeated = false;  // the field is repeated (its path carries an index)
  int line = 0;
  int column = 0;
};

// Every field name of `text`, read as text format of `type`, in text order. Stops at the first
// thing it does not understand (an unknown field is still returned, as the last mention), so on a
// text the parser rejects it returns the fields up to about the error.
std::vector<FieldMention> ScanFields(std::string_view text,
                                     const google::protobuf::Descriptor* type);

// The path of the last field mentioned at or before (line, column), or "" if none.
std::string FieldAt(const std::vector<FieldMention>& mentions, int line, int column);

// The first mention of a non-repeated field whose path was mentioned before; `first` gets the
// earlier one. Returns nullptr if every such field appears once.
const FieldMention* FindRepeatedSingular(const std::vector<FieldMention>& mentions,
                                         const FieldMention** first);

}  // namespace tutti::config::internal

#endif  // TUTTI_CONFIG_TEXT_SCAN_H_

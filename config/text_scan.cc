#include "config/text_scan.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tutti::config::internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::Tokenizer;

// The parser reports errors; the scanner only stops.
class IgnoreErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
};

// A recursive walk over the tokens with the grammar of text format, as far as tutti.v1.Config
// uses it: `name: value`, `name { ... }` / `name < ... >`, `name: [v, ...]`, `;` or `,` after a
// field, adjacent strings, a leading minus.
class Scanner {
 public:
  explicit Scanner(std::string_view text)
      : input_(text.data(), static_cast<int>(text.size())), tokens_(&input_, &errors_) {
    // As TextFormat::Parser sets them, so both see the same tokens.
    tokens_.set_allow_f_after_float(true);
    tokens_.set_comment_style(Tokenizer::SH_COMMENT_STYLE);
    tokens_.set_require_space_after_number(false);
    tokens_.set_allow_multiline_strings(true);
    tokens_.Next();
  }

  std::vector<FieldMention> Run(const Descriptor* type) {
    Message(type, "", "");
    return std::move(mentions_);
  }

 private:
  bool At(const char* symbol) {
    return tokens_.current().type == Tokenizer::TYPE_SYMBOL && tokens_.current().text == symbol;
  }
  bool TryConsume(const char* symbol) {
    if (!At(symbol)) return false;
    tokens_.Next();
    return true;
  }

  // The fields of one message, up to `close` ("" at the top level: the end of the text).
  bool Message(const Descriptor* type, const std::string& prefix, const char* close) {
    std::map<std::string, int> next_index;  // per repeated field
    while (true) {
      const Tokenizer::Token& t = tokens_.current();
      if (t.type == Tokenizer::TYPE_END) return close[0] == '\0';
      if (close[0] != '\0' && TryConsume(close)) return true;
      if (t.type != Tokenizer::TYPE_IDENTIFIER) return false;
      const FieldDescriptor* f = type->FindFieldByName(t.text);
      FieldMention m{prefix.empty() ? t.text : absl::StrCat(prefix, ".", t.text),
                     f != nullptr && f->is_repeated(), t.line, t.column};
      if (m.repeated) absl::StrAppend(&m.path, "[", next_index[t.text]++, "]");
      mentions_.push_back(m);
      if (f == nullptr) return false;
      tokens_.Next();
      if (!FieldValue(f, m.path)) return false;
      if (!TryConsume(";")) TryConsume(",");
    }
  }

  bool FieldValue(const FieldDescriptor* f, const std::string& path) {
    const bool colon = TryConsume(":");
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (TryConsume("{")) return Message(f->message_type(), path, "}");
      if (TryConsume("<")) return Message(f->message_type(), path, ">");
      return false;
    }
    if (!colon) return false;
    if (!TryConsume("[")) return Scalar();
    if (TryConsume("]")) return true;
    do {
      if (!Scalar()) return false;
    } while (TryConsume(","));
    return TryConsume("]");
  }

  bool Scalar() {
    TryConsume("-");
    const Tokenizer::TokenType type = tokens_.current().type;
    if (type == Tokenizer::TYPE_STRING) {
      while (tokens_.current().type == Tokenizer::TYPE_STRING) tokens_.Next();
      return true;
    }
    if (type != Tokenizer::TYPE_IDENTIFIER && type != Tokenizer::TYPE_INTEGER &&
        type != Tokenizer::TYPE_FLOAT) {
      return false;
    }
    tokens_.Next();
    return true;
  }

  IgnoreErrors errors_;
  google::protobuf::io::ArrayInputStream input_;
  Tokenizer tokens_;
  std::vector<FieldMention> mentions_;
};

}  // namespace

std::vector<FieldMention> ScanFields(std::string_view text, const Descriptor* type) {
  return Scanner(text).Run(type);
}

std::string FieldAt(const std::vector<FieldMention>& mentions, int line, int column) {
  std::string path;
  for (const FieldMention& m : mentions) {
    if (std::make_pair(m.line, m.column) > std::make_pair(line, column)) break;
    path = m.path;
  }
  return path;
}

const FieldMention* FindRepeatedSingular(const std::vector<FieldMention>& mentions,
                                         const FieldMention** first) {
  std::map<std::string, const FieldMention*> seen;
  for (const FieldMention& m : mentions) {
    if (m.repeated) continue;
    auto [it, inserted] = seen.emplace(m.path, &m);
    if (!inserted) {
      *first = it->second;
      return &m;
    }
  }
  return nullptr;
}

}  // namespace tutti::config::internal

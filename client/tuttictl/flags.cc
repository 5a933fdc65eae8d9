#include "client/tuttictl/flags.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti::tuttictl {
bool ParseUnsigned(const std::string& text, uint64_t* out) {
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    return absl::SimpleHexAtoi(absl::string_view(text).substr(2), out);
  }
  return !text.empty() && text[0] != '-' && text[0] != '+' && absl::SimpleAtoi(text, out);
}

namespace {

const char* TypeName(int type) {
  static const char* kNames[] = {"", "<string>", "<n>", "<n>"};
  return kNames[type];
}

}  // namespace

void FlagSet::Bool(const std::string& name, bool* out, const std::string& help) {
  flags_.push_back({name, Type::kBool, out, help, *out ? "true" : "false"});
}
void FlagSet::String(const std::string& name, std::string* out, const std::string& help) {
  flags_.push_back({name, Type::kString, out, help, *out});
}
void FlagSet::Uint64(const std::string& name, uint64_t* out, const std::string& help) {
  flags_.push_back({name, Type::kUint64, out, help, absl::StrCat(*out)});
}
void FlagSet::Uint32(const std::string& name, uint32_t* out, const std::string& help) {
  flags_.push_back({name, Type::kUint32, out, help, absl::StrCat(*out)});
}

const FlagSet::Flag* FlagSet::Find(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::TakesValue(const std::string& name) const {
  const Flag* f = Find(name);
  return f != nullptr && f->type != Type::kBool;
}

bool FlagSet::WasSet(const std::string& name) const {
  return std::find(set_.begin(), set_.end(), name) != set_.end();
}

absl::Status FlagSet::Set(const Flag& flag, const std::string& value) const {
  auto bad = [&](const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag.name, ": '", value, "' is not ", want));
  };
  uint64_t n = 0;
  switch (flag.type) {
    case Type::kBool:
      if (value != "true" && value != "false") return bad("true or false");
      *static_cast<bool*>(flag.out) = value == "true";
      break;
    case Type::kString:
      *static_cast<std::string*>(flag.out) = value;
      break;
    case Type::kUint64:
      if (!ParseUnsigned(value, &n)) return bad("an unsigned number");
      *static_cast<uint64_t*>(flag.out) = n;
      break;
    case Type::kUint32:
      if (!ParseUnsigned(value, &n) || n > UINT32_MAX) return bad("an unsigned 32-bit number");
      *static_cast<uint32_t*>(flag.out) = static_cast<uint32_t>(n);
      break;
  }
  set_.push_back(flag.name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(
    const std::vector<std::string>& args) const {
  set_.clear();
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-' || (arg[1] != '-' && arg.size() != 2)) {
      positional.push_back(arg);
      continue;
    }
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = body.substr(0, eq);
    const Flag* flag = Find(name);
    if (flag == nullptr && eq == std::string::npos && name.rfind("no", 0) == 0) {
      const Flag* negated = Find(name.substr(2));
      if (negated != nullptr && negated->type == Type::kBool) {
        if (absl::Status s = Set(*negated, "false"); !s.ok()) return s;
        continue;
      }
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (flag->type == Type::kBool) {
      value = "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    if (absl::Status s = Set(*flag, value); !s.ok()) return s;
  }
  return positional;
}

std::string FlagSet::Help() const {
  size_t width = 0;
  std::vector<std::string> heads;
  for (const Flag& f : flags_) {
    heads.push_back(absl::StrCat("--", f.name, f.type == Type::kBool ? "" : "=",
                                 TypeName(static_cast<int>(f.type))));
    width = std::max(width, heads.back().size());
  }
  std::string out;
  for (size_t i = 0; i < flags_.size(); ++i) {
    const Flag& f = flags_[i];
    const bool show_default = f.type != Type::kBool && !f.default_text.empty();
    absl::StrAppendFormat(&out, "  %-*s  %s%s\n", width, heads[i], f.help,
                          show_default ? absl::StrCat(" (default ", f.default_text, ")") : "");
  }
  return out;
}

}  // namespace tutti::tuttictl

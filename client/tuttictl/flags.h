// A small command-line parser for tuttictl: each subcommand declares its own flags, so a flag
// given to the wrong subcommand is a usage error (exit 2) rather than silently ignored.
//
// Accepted forms: --name=value, --name value, --flag (bool true), --noflag (bool false),
// --flag=true|false. "--" ends the flags. Unsigned flags take decimal or 0x-prefixed hex.
//
// Thread-safety: not thread-safe; use from main.
#ifndef TUTTI_CLIENT_TUTTICTL_FLAGS_H_
#define TUTTI_CLIENT_TUTTICTL_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tutti::tuttictl {

// Decimal, or hex after "0x"/"0X", as unsigned flags take them (also for positional ids). False
// for anything else, a sign included.
bool ParseUnsigned(const std::string& text, uint64_t* out);

class FlagSet {
 public:
  // Registers a flag whose value is written into `*out` when given; `*out` keeps its default
  // otherwise. `out` must outlive Parse.
  void Bool(const std::string& name, bool* out, const std::string& help);
  void String(const std::string& name, std::string* out, const std::string& help);
  void Uint64(const std::string& name, uint64_t* out, const std::string& help);
  void Uint32(const std::string& name, uint32_t* out, const std::string& help);

  // Parses `args` (without the program name), setting flags; returns the positional arguments in
  // order. INVALID_ARGUMENT naming the flag for an unknown flag, a missing or malformed value.
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args) const;

  // True if `name` is a registered flag that takes a value (not a bool).
  bool TakesValue(const std::string& name) const;
  // Whether the flag was given on the last Parse.
  bool WasSet(const std::string& name) const;

  // "  --name=<type>   help" lines, aligned.
  std::string Help() const;

 private:
  enum class Type { kBool, kString, kUint64, kUint32 };
  struct Flag {
    std::string name;
    Type type;
    void* out;
    std::string help;
    std::string default_text;
  };
  const Flag* Find(const std::string& name) const;
  absl::Status Set(const Flag& flag, const std::string& value) const;

  std::vector<Flag> flags_;
  mutable std::vector<std::string> set_;
};

}  // namespace tutti::tuttictl

#endif  // TUTTI_CLIENT_TUTTICTL_FLAGS_H_

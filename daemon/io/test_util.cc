#include "daemon/io/test_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tutti::io::testing {
namespace {

// True when a file in `dir` can be opened with O_DIRECT.
bool SupportsODirect(const std::string& dir, std::string* why) {
  const std::string probe = dir + "/.odirect_probe";
  const int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    absl::StrAppend(why, dir, ": O_DIRECT open failed: ", std::strerror(errno), "; ");
    return false;
  }
  close(fd);
  unlink(probe.c_str());
  return true;
}

}  // namespace

std::string MakeODirectDir(const std::string& name, std::string* why) {
  std::vector<std::string> roots;
  if (const char* t = std::getenv("TEST_TMPDIR"); t != nullptr && *t != '\0') roots.push_back(t);
  roots.push_back("/var/tmp");
  roots.push_back("/tmp");
  why->clear();
  for (const std::string& root : roots) {
    std::string tmpl = absl::StrCat(root, "/tutti-", name, "-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      absl::StrAppend(why, root, ": mkdtemp failed: ", std::strerror(errno), "; ");
      continue;
    }
    if (SupportsODirect(tmpl, why)) return tmpl;
    RemoveTree(tmpl);
  }
  absl::StrAppend(why, "no directory supports O_DIRECT");
  return "";
}

void RemoveTree(const std::string& dir) {
  nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace tutti::io::testing

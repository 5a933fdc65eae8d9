// Helpers for tests (and benchmarks, which start tuttid through tests/common: hence not testonly
// in Bazel) of code that needs files opened with O_DIRECT.
#ifndef TUTTI_DAEMON_IO_TEST_UTIL_H_
#define TUTTI_DAEMON_IO_TEST_UTIL_H_

#include <string>

namespace tutti::io::testing {

// Creates and returns a fresh, empty directory named after `name` on a filesystem that accepts
// O_DIRECT: under $TEST_TMPDIR when it does (tmpfs does not), else under /var/tmp or /tmp.
// Returns "" and explains in `*why` when none does; the caller should then GTEST_SKIP() << *why.
std::string MakeODirectDir(const std::string& name, std::string* why);

// Removes `dir` and everything in it (best effort).
void RemoveTree(const std::string& dir);

}  // namespace tutti::io::testing

#endif  // TUTTI_DAEMON_IO_TEST_UTIL_H_

// The main() of a fuzz target in the ordinary build (no libFuzzer): runs LLVMFuzzerTestOneInput
// once on every file of each directory (or file) named on the command line, in name order, so
// `bazel test` replays the committed corpus. Exits 1 if it found no input at all (a corpus path
// gone wrong must not pass silently); a crash or abort of the target fails the test as it would
// under libFuzzer. With --config=fuzz the target links libFuzzer's main instead (fuzz.bzl).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> Inputs(const char* arg) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(arg)) {
    for (const auto& e : std::filesystem::directory_iterator(arg)) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
  } else if (std::filesystem::is_regular_file(arg)) {
    out.emplace_back(arg);
  } else {
    std::fprintf(stderr, "%s: no such file or directory\n", arg);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  size_t count = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& path : Inputs(argv[i])) {
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      std::fprintf(stderr, "input %s (%zu bytes)\n", path.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++count;
    }
  }
  std::fprintf(stderr, "%zu inputs replayed\n", count);
  return count == 0 ? 1 : 0;
}

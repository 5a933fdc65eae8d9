// Fuzz target: journal replay (the input is state_dir/journal.1, no checkpoint).
#include "tests/fuzz/journal_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::ReplayAsStateFile("journal.1", data, size);
  return 0;
}

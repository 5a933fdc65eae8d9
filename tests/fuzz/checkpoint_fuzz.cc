// Fuzz target: checkpoint replay (the input is state_dir/checkpoint, no journal file).
#include "tests/fuzz/journal_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::ReplayAsStateFile("checkpoint", data, size);
  return 0;
}

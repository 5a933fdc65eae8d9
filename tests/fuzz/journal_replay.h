// The body of the journal and checkpoint fuzz targets: writes an input as one file of a fresh state
// directory and replays it with Journal::Open, once as given and once with every record's checksum
// re-sealed (fuzz_util.h). Checks that replay never crashes, that a replay that succeeded succeeds
// again over what it left (the same records), and that a refusal is DATA_LOSS, FAILED_PRECONDITION
// or INTERNAL with a message.
#ifndef TUTTI_TESTS_FUZZ_JOURNAL_REPLAY_H_
#define TUTTI_TESTS_FUZZ_JOURNAL_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti::fuzz {

// `file_name`: "journal.1" or "checkpoint".
void ReplayAsStateFile(const std::string& file_name, const uint8_t* data, size_t size);

}  // namespace tutti::fuzz

#endif  // TUTTI_TESTS_FUZZ_JOURNAL_REPLAY_H_

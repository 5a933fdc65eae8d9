#include "tests/fuzz/fuzz_util.h"

#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace tutti::fuzz {
namespace {

uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian on every host tutti builds for
  return v;
}

void Append64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

constexpr size_t kPage = 4096;
constexpr size_t kSlotChecksumAt = 56;
constexpr uint64_t kSlotHeaderSeed = 0x7475747469534C48ull;
constexpr size_t kSuperblockChecksumAt = kPage - 8;

}  // namespace

std::string SealJournalRecords(const uint8_t* data, size_t size) {
  std::string out;
  size_t at = 0;
  while (size - at >= 8) {
    const uint32_t length = Get32(data + at);
    const size_t payload = std::min<size_t>(length, size - at - 8);
    std::string record(reinterpret_cast<const char*>(data + at), 8 + payload);
    if (payload < length) {  // a torn tail: keep as is
      out += record;
      return out;
    }
    // XXH3 of the type (4 bytes) followed by the payload.
    Append64(&record, XXH3_64bits(record.data() + 4, 4 + payload));
    out += record;
    at += 8 + payload + std::min<size_t>(8, size - at - 8 - payload);
  }
  out.append(reinterpret_cast<const char*>(data + at), size - at);
  return out;
}

void SealSlotHeader(uint8_t* page) {
  std::memset(page + kSlotChecksumAt, 0, 8);
  const uint64_t sum = XXH3_64bits_withSeed(page, kPage, kSlotHeaderSeed);
  std::memcpy(page + kSlotChecksumAt, &sum, 8);
}

void SealSuperblock(uint8_t* page) {
  const uint64_t sum = XXH3_64bits(page, kSuperblockChecksumAt);
  std::memcpy(page + kSuperblockChecksumAt, &sum, 8);
}

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* tmp = getenv("TEST_TMPDIR");
    std::string t = std::string(tmp != nullptr ? tmp : "/tmp") + "/tutti_fuzz.XXXXXX";
    if (mkdtemp(t.data()) == nullptr) {
      std::perror("mkdtemp");
      abort();
    }
    return new std::string(t);
  }();
  return *dir;
}

void ClearDir(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) std::filesystem::remove(e.path());
}

void WriteFileOrDie(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    abort();
  }
}

}  // namespace tutti::fuzz

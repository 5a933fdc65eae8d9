// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the real
// encoders: valid inputs and near-valid ones (truncated, one field off, a flipped byte). Run it
// after a format change and commit the result:
//   bazel run //tests/fuzz:make_seeds -- $PWD/tests/fuzz/corpus /var/tmp  # a dir with O_DIRECT
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "config/config.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/pool_files.h"
#include "daemon/pool/slot_header.h"
#include "daemon/server/service_test_env.h"
#include "daemon/store/journal.h"
#include "tests/fuzz/fuzz_util.h"

namespace tutti::fuzz {
namespace {

std::string g_root;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(g_root + "/" + target);
  WriteFileOrDie(g_root + "/" + target + "/" + name, bytes);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string Flip(std::string s, size_t at) {
  if (!s.empty()) s[at % s.size()] ^= 0x5a;
  return s;
}

void ConfigSeeds() {
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"empty", ""},
      {"default", std::string(config::DefaultConfigText())},
      {"rendered", config::RenderConfig(config::DefaultConfig())},
      {"dirs",
       "pool { dirs: \"/ssd0\" dirs: [\"/ssd1\", \"/ssd2\"] capacity_bytes: 1099511627776 }"},
      {"octal_mode", "listen { socket_mode: 0600 socket_group: \"tutti\" }\n"},
      {"gpu", "gpu { mode: \"cuda\" device: 1 io_sm_count: 16 scatter: \"copy_engine\" }"},
      {"limits", "limits < max_sessions: 8; lease_ttl_ms: 1000 >\nlog_level: \"debug\""},
      {"comment", "# comment\nstate_dir: \"/srv/tutti\"  # trailing\n"},
      {"dup_field", "limits { max_sessions: 8 max_sessions: 9 }"},
      {"dup_message", "pool { object_bytes: 8192 } pool { max_objects: 8 }"},
      {"unknown", "pool { bogus: 1 }"},
      {"bad_value", "pool { object_bytes: \"big\" }"},
      {"negative", "limits { lease_ttl_ms: -5 }"},
      {"overflow", "dram { capacity_bytes: 99999999999999999999999 }"},
      {"unclosed", "pool {"},
      {"strings", "state_dir: \"/a\" \"/b\"  listen { socket_path: '/run/x\\n.sock' }"},
      {"out_of_range", "io { queue_depth: 5000 }"},
      {"relative", "state_dir: \"relative\""},
  };
  for (const auto& [name, text] : texts) Seed("config_fuzz", name, text);
}

store::PutRecord Put(uint64_t slot, uint32_t objects) {
  store::PutRecord p;
  p.ns = 77;
  for (int i = 0; i < 16; ++i) p.key.bytes[i] = static_cast<uint8_t>(slot * 16 + i);
  p.slot = slot;
  p.epoch = slot + 1;
  p.object_len = 2048;
  for (uint32_t o = 0; o < objects; ++o) p.checksums.push_back(slot * 1000 + o);
  return p;
}

void JournalSeeds(const std::string& scratch) {
  std::filesystem::remove_all(scratch);
  std::filesystem::create_directories(scratch);
  store::RecoveryReport report;
  auto journal = store::Journal::Open(scratch, {}, &report);
  if (!journal.ok()) abort();
  (*journal)->Append(
      store::NamespaceRecord{77, server::testing::TestNamespace().SerializeAsString()});
  for (uint64_t s = 0; s < 4; ++s) (*journal)->Append(Put(s, 4));
  (*journal)->Append(store::DeleteRecord{77, Put(1, 4).key, 1, 2});
  if (!(*journal)->Sync().ok()) abort();
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(scratch)) {
    if (e.path().filename().string().rfind("journal.", 0) == 0) file = e.path();
  }
  const std::string j = ReadAll(file);
  Seed("journal_fuzz", "valid", j);
  Seed("journal_fuzz", "header_only", j.substr(0, 40));
  Seed("journal_fuzz", "torn_tail", j.substr(0, j.size() - 5));
  Seed("journal_fuzz", "torn_length", j.substr(0, 44));
  Seed("journal_fuzz", "flipped_put", Flip(j, j.size() / 2));
  Seed("journal_fuzz", "flipped_header", Flip(j, 3));
  Seed("journal_fuzz", "empty", "");
  (void)(*journal)->Checkpoint([](store::Journal::Emitter& e) {
    e.Emit(store::NamespaceRecord{77, server::testing::TestNamespace().SerializeAsString()});
    for (uint64_t s = 0; s < 3; ++s) e.Emit(Put(s, 4));
  });
  const std::string c = ReadAll(scratch + "/checkpoint");
  Seed("checkpoint_fuzz", "valid", c);
  Seed("checkpoint_fuzz", "no_end", c.substr(0, c.size() - 24));
  Seed("checkpoint_fuzz", "truncated", c.substr(0, c.size() / 2));
  Seed("checkpoint_fuzz", "flipped", Flip(c, c.size() / 3));
  Seed("checkpoint_fuzz", "journal_kind", j);
  Seed("checkpoint_fuzz", "empty", "");
  journal->reset();
  std::filesystem::remove_all(scratch);
}

void SlotHeaderSeeds() {
  for (uint32_t n : {0u, 1u, 8u, 64u, pool::kMaxObjectsPerSlot}) {
    pool::SlotHeader h = {};
    h.ns = 77 + n;
    h.key = Put(n, 0).key;
    h.epoch = 1000 + n;
    h.object_len = 32768;
    for (uint32_t o = 0; o < n; ++o) h.checksums.push_back(o * 0x9e3779b97f4a7c15ull);
    std::string page(pool::kSlotHeaderBytes, '\0');
    if (!pool::EncodeSlotHeader(
             h, absl::MakeSpan(reinterpret_cast<uint8_t*>(page.data()), page.size()))
             .ok()) {
      abort();
    }
    Seed("slot_header_fuzz", "objects_" + std::to_string(n), page);
    if (n == 8) {
      Seed("slot_header_fuzz", "short", page.substr(0, 100));
      Seed("slot_header_fuzz", "flipped", Flip(page, 20));
      std::string many = page;
      many[6] = '\xff';  // object count 0x??ff: past kMaxObjectsPerSlot
      many[7] = '\x7f';
      Seed("slot_header_fuzz", "count_too_large", many);
    }
  }
  Seed("slot_header_fuzz", "zeros", std::string(pool::kSlotHeaderBytes, '\0'));
}

void SuperblockSeeds(const std::string& scratch) {
  std::filesystem::remove_all(scratch);
  std::filesystem::create_directories(scratch);
  auto layout = pool::PoolLayout::Compute(64ull << 20, 1, 4096, 8);
  auto files = pool::OpenOrCreatePool({scratch}, *layout);
  if (!files.ok()) {
    std::fprintf(stderr, "%s\n", files.status().ToString().c_str());
    abort();
  }
  files = pool::PoolFiles();
  const std::string sb = ReadAll(scratch + "/" + pool::kPoolFileName).substr(0, 4096);
  std::filesystem::remove_all(scratch);
  Seed("superblock_fuzz", "valid", sb);
  Seed("superblock_fuzz", "flipped", Flip(sb, 20));
  Seed("superblock_fuzz", "bad_magic", Flip(sb, 0));
  Seed("superblock_fuzz", "zeros", std::string(4096, '\0'));
  // One field off, re-sealed (the target re-seals too; sealed here so the raw pass also gets past
  // the checksum).
  const std::vector<std::pair<std::string, size_t>> fields = {
      {"version", 8},      {"file_index", 12}, {"num_files", 16}, {"object_bytes", 20},
      {"max_objects", 24}, {"num_slots", 32},  {"file_bytes", 40}};
  for (const auto& [name, at] : fields) {
    std::string s = sb;
    s[at] ^= 0x01;
    SealSuperblock(reinterpret_cast<uint8_t*>(s.data()));
    Seed("superblock_fuzz", "sealed_" + name, s);
  }
}

std::string Req(uint8_t method, uint8_t flags, const google::protobuf::Message& m) {
  return std::string{static_cast<char>(method), static_cast<char>(flags)} + m.SerializeAsString();
}

void ServiceSeeds() {
  using server::testing::KeyBytes;
  enum : uint8_t {
    kAttach,
    kKeepAlive,
    kLookup,
    kRetrieve,
    kStore,
    kRelease,
    kDetach,
    kReportCompute
  };
  server::testing::ShmEngine engine;
  tutti::v1::AttachRequest attach = engine.AttachRequest();
  attach.mutable_regions(0)->mutable_host_shm()->set_name("/tutti_fuzz_no_such_object");
  Seed("service_fuzz", "attach_missing_shm", Req(kAttach, 0, attach));
  attach.mutable_namespace_()->mutable_layout()->set_block_tokens(69632);
  Seed("service_fuzz", "attach_bad_layout", Req(kAttach, 0, attach));
  Seed("service_fuzz", "attach_empty", Req(kAttach, 0, tutti::v1::AttachRequest()));
  tutti::v1::KeepAliveRequest keep;
  Seed("service_fuzz", "keepalive_own", Req(kKeepAlive, 1, keep));
  keep.set_session_id(12345);
  Seed("service_fuzz", "keepalive_other", Req(kKeepAlive, 0, keep));
  tutti::v1::StoreRequest store;
  for (uint32_t b = 0; b < 4; ++b) {
    auto* p = store.add_blocks();
    p->set_key(KeyBytes(b));
    p->set_engine_block(b);
  }
  Seed("service_fuzz", "store", Req(kStore, 1, store));
  store.set_wait_durable(true);
  Seed("service_fuzz", "store_durable", Req(kStore, 1, store));
  store.set_layer_begin(1);
  store.set_layer_end(2);
  Seed("service_fuzz", "store_layer", Req(kStore, 1, store));
  store.mutable_blocks(0)->set_engine_block(1000);
  Seed("service_fuzz", "store_bad_block", Req(kStore, 1, store));
  store.mutable_blocks(0)->set_key("short");
  Seed("service_fuzz", "store_bad_key", Req(kStore, 1, store));
  tutti::v1::LookupRequest lookup;
  for (uint32_t b = 0; b < 5; ++b) lookup.add_keys(KeyBytes(b));
  Seed("service_fuzz", "lookup", Req(kLookup, 1, lookup));
  lookup.add_keys("not sixteen");
  Seed("service_fuzz", "lookup_bad_key", Req(kLookup, 1, lookup));
  lookup.clear_keys();
  for (uint32_t b = 0; b < 5; ++b) lookup.add_keys(KeyBytes(b));
  lookup.set_prompt_tokens(90);
  Seed("service_fuzz", "lookup_prompt", Req(kLookup, 1, lookup));
  tutti::v1::ReportComputeRequest report;
  for (uint32_t n : {16u, 64u, 80u}) {
    auto* s = report.add_samples();
    s->set_new_tokens(n);
    s->set_context_tokens(80);
    s->set_layer_ms(0.01 * n);
    s->set_overhead_ms(0.5);
  }
  Seed("service_fuzz", "report_compute", Req(kReportCompute, 1, report));
  report.set_decision_id(1);
  report.set_measured_ttft_ms(2.5);
  Seed("service_fuzz", "report_compute_ttft", Req(kReportCompute, 1, report));
  report.mutable_samples(0)->set_layer_ms(-1);
  Seed("service_fuzz", "report_compute_bad", Req(kReportCompute, 1, report));
  tutti::v1::RetrieveRequest retrieve;
  for (uint32_t b = 0; b < 4; ++b) {
    auto* p = retrieve.add_blocks();
    p->set_key(KeyBytes(b));
    p->set_engine_block(7 - b);
  }
  Seed("service_fuzz", "retrieve_leased", Req(kRetrieve, 3, retrieve));
  retrieve.set_layer_begin(1);
  Seed("service_fuzz", "retrieve_layer", Req(kRetrieve, 3, retrieve));
  retrieve.set_layer_end(9);
  Seed("service_fuzz", "retrieve_bad_layers", Req(kRetrieve, 3, retrieve));
  retrieve.set_lease_id(99);
  Seed("service_fuzz", "retrieve_unleased", Req(kRetrieve, 1, retrieve));
  tutti::v1::ReleaseRequest release;
  Seed("service_fuzz", "release_leased", Req(kRelease, 3, release));
  release.set_lease_id(5);
  Seed("service_fuzz", "release_unknown", Req(kRelease, 1, release));
  tutti::v1::DetachRequest detach;
  detach.set_session_id(4242);
  Seed("service_fuzz", "detach_other", Req(kDetach, 0, detach));
  Seed("service_fuzz", "detach_own", Req(kDetach, 1, detach));
  Seed("service_fuzz", "garbage", std::string("\x03\x01\xff\xff\xff\x0f", 6));
}

}  // namespace
}  // namespace tutti::fuzz

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: make_seeds CORPUS_DIR SCRATCH_DIR (on a filesystem with O_DIRECT)\n");
    return 2;
  }
  tutti::fuzz::g_root = argv[1];
  const std::string scratch =
      std::string(argv[2]) + "/tutti_make_seeds." + std::to_string(getpid());
  tutti::fuzz::ConfigSeeds();
  tutti::fuzz::JournalSeeds(scratch);
  tutti::fuzz::SlotHeaderSeeds();
  tutti::fuzz::SuperblockSeeds(scratch);
  tutti::fuzz::ServiceSeeds();
  return 0;
}

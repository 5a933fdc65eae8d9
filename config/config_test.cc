#include "config/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::config {
namespace {

using ::testing::HasSubstr;

// Loads `text` and expects INVALID_ARGUMENT whose message contains every one of `parts`.
void ExpectRejected(const std::string& text, std::initializer_list<std::string> parts) {
  auto c = LoadConfig(text);
  ASSERT_FALSE(c.ok()) << "accepted: " << text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  for (const auto& p : parts) EXPECT_THAT(std::string(c.status().message()), HasSubstr(p)) << text;
}

TEST(ConfigTest, DefaultsAreValidAndMatchTheDesign) {
  auto c = LoadConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state_dir(), "/var/lib/tutti");
  EXPECT_EQ(c->listen().socket_path(), "/run/tutti/tuttid.sock");
  EXPECT_EQ(c->listen().socket_mode(), 0660u);  // written as octal 0660 in default.textproto
  EXPECT_EQ(c->listen().socket_group(), "tutti");
  EXPECT_EQ(c->pool().dirs_size(), 0);
  EXPECT_EQ(c->pool().capacity_bytes(), 4ull << 30);
  EXPECT_EQ(c->pool().object_bytes(), 32768u);
  EXPECT_EQ(c->pool().max_objects(), 64u);
  EXPECT_EQ(c->pool().admission(), "all");
  EXPECT_EQ(c->pool().admission_ghost_blocks(), 0u);
  EXPECT_EQ(c->pool().recency(), "tail_first");
  EXPECT_EQ(c->io().backend(), "uring");
  EXPECT_EQ(c->io().queue_depth(), 64u);
  EXPECT_EQ(c->io().nvme_nsid(), 1u);
  EXPECT_EQ(c->dram().capacity_bytes(), 1ull << 30);
  EXPECT_EQ(c->limits().max_blocks_per_call(), 2048u);
  EXPECT_EQ(c->limits().session_ttl_ms(), 30000u);
  EXPECT_EQ(c->limits().lease_ttl_ms(), 30000u);
  EXPECT_EQ(c->limits().store_staging_bytes(), 256ull << 20);
  EXPECT_EQ(c->limits().retrieve_staging_bytes(), 256ull << 20);
  EXPECT_EQ(c->limits().max_sessions(), 64u);
  EXPECT_EQ(c->limits().max_namespaces_per_user(), 64u);
  EXPECT_EQ(c->limits().pool_share_per_user(), 1.0);
  EXPECT_EQ(c->security().namespace_sharing(), "user");
  EXPECT_EQ(c->journal().checkpoint_every(), 65536u);
  EXPECT_EQ(c->log_level(), "info");
  EXPECT_EQ(c->gpu().mode(), "auto");
  EXPECT_EQ(c->gpu().device(), 0u);
  EXPECT_EQ(c->gpu().io_sm_count(), 16u);
  EXPECT_EQ(c->gpu().copy_ctas(), 0u);
  EXPECT_EQ(c->gpu().scatter(), "auto");
  EXPECT_EQ(c->gpu().round_bytes(), 32ull << 20);
  EXPECT_EQ(c->gpu().max_staging_bytes(), 512ull << 20);
  EXPECT_EQ(c->datapath().max_read_bytes(), 1ull << 20);
  EXPECT_TRUE(ValidateConfig(DefaultConfig()).ok());
}

TEST(ConfigTest, FileOverridesDefaultsIncludingZero) {
  auto c = LoadConfig(
      "state_dir: \"/tmp/x\"\n"
      "listen { socket_mode: 0600 }\n"
      "pool { dirs: \"/ssd0\" dirs: \"/ssd1\" }\n"
      "dram { capacity_bytes: 0 }\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state_dir(), "/tmp/x");
  EXPECT_EQ(c->listen().socket_mode(), 0600u);
  EXPECT_EQ(c->listen().socket_path(), "/run/tutti/tuttid.sock");  // untouched default
  ASSERT_EQ(c->pool().dirs_size(), 2);
  EXPECT_EQ(c->pool().dirs(1), "/ssd1");
  EXPECT_EQ(c->dram().capacity_bytes(), 0u);  // zero turns the tier off, not "use default"
  EXPECT_EQ(c->pool().object_bytes(), 32768u);
}

TEST(ConfigTest, DecimalSocketModeAlsoParses) {
  auto c = LoadConfig("listen { socket_mode: 432 }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen().socket_mode(), 0660u);
}

TEST(ConfigTest, ParseErrorsCarryLineAndColumn) {
  ExpectRejected("state_dir: \"/x\"\npool { bogus_field: 1 }\n",
                 {"line 2, column ", "bogus_field"});
  ExpectRejected("pool { object_bytes: \"big\" }", {"line 1, column "});
  ExpectRejected("pool {", {"line 1, column "});
  ExpectRejected("unknown: 3", {"line 1, column ", "no field named \"unknown\""});
}

TEST(ConfigTest, ParseErrorsNameTheFieldPath) {
  ExpectRejected("state_dir: \"/x\"\npool { bogus_field: 1 }\n",
                 {"line 2, column 19: pool.bogus_field: "});
  ExpectRejected("pool { object_bytes: \"big\" }", {"line 1, column 22: pool.object_bytes: "});
  ExpectRejected("# a comment\nlimits {\n  max_sessions: 4\n  lease_ttl_ms: -5\n}",
                 {"line 4, column ", "limits.lease_ttl_ms: "});
  ExpectRejected("pool { dirs: \"/a\" dirs: 7 }", {"pool.dirs[1]: "});
  ExpectRejected("dram { capacity_bytes: 99999999999999999999999 }", {"dram.capacity_bytes: "});
}

TEST(ConfigTest, AFieldGivenTwiceIsRefusedNamingIt) {
  ExpectRejected("limits { store_staging_bytes: 268435456 store_staging_bytes: 536870912 }",
                 {"line 1, column 41: limits.store_staging_bytes is given twice",
                  "first at line 1, column 10"});
  ExpectRejected("state_dir: \"/a\"\nstate_dir: \"/b\"",
                 {"line 2, column 1: state_dir is given twice"});
  // Also across two blocks of one sub-message, and the sub-message itself.
  ExpectRejected("pool { object_bytes: 8192 }\npool { max_objects: 8 }",
                 {"line 2, column 1: pool is given twice"});
  // Zero values count: proto3 keeps no presence, the text does.
  ExpectRejected("dram { capacity_bytes: 0 capacity_bytes: 0 }", {"dram.capacity_bytes"});
  // Lists may repeat, in either syntax.
  auto c = LoadConfig("pool { dirs: \"/a\" dirs: [\"/b\", \"/c\"] dirs: \"/d\" }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool().dirs_size(), 4);
}

// A file in the test's temp directory, removed at the end.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/config_file_test_" + std::to_string(getpid());
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0) << strerror(errno);
  }
  void TearDown() override {
    unlink(file().c_str());
    rmdir(dir_.c_str());
  }
  std::string file() const { return dir_ + "/tuttid.textproto"; }
  void Write(const std::string& text) { std::ofstream(file()) << text; }

  std::string dir_;
};

TEST_F(ConfigFileTest, ARegularFileIsLoaded) {
  Write("state_dir: \"/srv/tutti\"\n");
  auto c = LoadConfigFile(file());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state_dir(), "/srv/tutti");
}

TEST_F(ConfigFileTest, ADirectoryIsRefusedNamingThePathAndErrno) {
  auto c = LoadConfigFile(dir_);
  ASSERT_FALSE(c.ok()) << "a directory was read as an empty config";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(dir_));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(strerror(EISDIR)));
}

TEST_F(ConfigFileTest, MissingFifoAndUnreadableFilesAreRefused) {
  auto missing = LoadConfigFile(dir_ + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(strerror(ENOENT)));
  ASSERT_EQ(mkfifo(file().c_str(), 0600), 0) << strerror(errno);
  auto fifo = LoadConfigFile(file());  // must not block waiting for a writer
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kFailedPrecondition) << fifo.status();
  EXPECT_THAT(std::string(fifo.status().message()), HasSubstr("not a regular file"));
}

TEST_F(ConfigFileTest, ErrorsInTheTextNameTheFile) {
  Write("pool { object_bytes: 1000 }\n");
  auto c = LoadConfigFile(file());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(file() + ": pool.object_bytes = 1000"));
}

TEST(ConfigTest, EachBadFieldIsRejectedWithItsName) {
  ExpectRejected("state_dir: \"relative\"", {"state_dir", "absolute"});
  ExpectRejected("state_dir: \"\"", {"state_dir"});
  ExpectRejected("listen { socket_path: \"tuttid.sock\" }", {"listen.socket_path", "absolute"});
  ExpectRejected("listen { socket_path: \"/" + std::string(120, 'a') + "\" }",
                 {"listen.socket_path", "99"});
  ExpectRejected("listen { socket_mode: 01777 }", {"listen.socket_mode", "0777"});
  ExpectRejected("listen { socket_group: \"a/b\" }", {"listen.socket_group"});
  ExpectRejected("listen { admin_socket_mode: 01777 }", {"listen.admin_socket_mode"});
  ExpectRejected("listen { admin_socket_path: \"/run/tutti/tuttid.sock\" }",
                 {"listen.admin_socket_path", "must differ"});
  ExpectRejected("limits { max_sessions_per_user: 65 }", {"limits.max_sessions_per_user"});
  ExpectRejected("limits { max_leases_per_session: 0 }", {"limits.max_leases_per_session"});
  ExpectRejected("limits { max_pending_events: 10 }", {"limits.max_pending_events", "1024"});
  ExpectRejected("limits { max_pending_events_total: 1000 }",
                 {"limits.max_pending_events_total", "65536"});
  ExpectRejected("limits { max_pinned_blocks_per_session: 10 }",
                 {"limits.max_pinned_blocks_per_session"});
  ExpectRejected("limits { max_pinned_blocks_per_user: 10 }",
                 {"limits.max_pinned_blocks_per_user"});
  ExpectRejected("limits { max_pinned_pool_share_per_user: 0 }",
                 {"limits.max_pinned_pool_share_per_user", "(0, 1]"});
  ExpectRejected("limits { max_pinned_pool_share: 1.5 }", {"limits.max_pinned_pool_share"});
  ExpectRejected("limits { max_calls_per_session: 0 }", {"limits.max_calls_per_session"});
  ExpectRejected("limits { max_rpc_threads: 2 }", {"limits.max_rpc_threads"});
  ExpectRejected("limits { max_namespaces_per_user: 0 }", {"limits.max_namespaces_per_user"});
  ExpectRejected("limits { pool_share_per_user: 0 }", {"limits.pool_share_per_user", "(0, 1]"});
  ExpectRejected("limits { pool_share_per_user: 1.5 }", {"limits.pool_share_per_user"});
  ExpectRejected("security { namespace_sharing: \"everyone\" }",
                 {"security.namespace_sharing", "host"});
  ExpectRejected("pool { dirs: \"ssd\" }", {"pool.dirs[0]", "absolute"});
  ExpectRejected("pool { dirs: \"/a\" dirs: \"/a\" }", {"pool.dirs[1]", "repeat"});
  ExpectRejected("pool { capacity_bytes: 1000 }", {"pool.capacity_bytes", "67108864"});
  ExpectRejected("pool { capacity_bytes: 2000000000000000000 }", {"pool.capacity_bytes"});
  ExpectRejected("pool { object_bytes: 1000 }", {"pool.object_bytes", "multiple of 4096"});
  ExpectRejected("pool { object_bytes: 0 }", {"pool.object_bytes"});
  ExpectRejected("pool { object_bytes: 134217728 }", {"pool.object_bytes", "67108864"});
  ExpectRejected("pool { max_objects: 0 }", {"pool.max_objects", "[1, 496]"});
  ExpectRejected("pool { max_objects: 497 }", {"pool.max_objects", "[1, 496]"});
  ExpectRejected("pool { extent_slots: 4097 }", {"pool.extent_slots", "[0, 4096]"});
  ExpectRejected("pool { admission: \"lru\" }", {"pool.admission", "all", "second_sight"});
  ExpectRejected("pool { recency: \"lru\" }", {"pool.recency", "tail_first", "chain"});
  ExpectRejected("pool { admission: \"dram_front\" } dram { capacity_bytes: 0 }",
                 {"pool.admission", "dram_front", "dram.capacity_bytes"});
  ExpectRejected("pool { admission_ghost_blocks: 300000000 }",
                 {"pool.admission_ghost_blocks", "268435456"});
  ExpectRejected("io { backend: \"spdk\" }",
                 {"io.backend", "uring", "memory", "gds", "uring_cmd", "nvme"});
  ExpectRejected("io { backend: \"nvme\" }", {"io.nvme_devices", "vfio-pci", "0000:01:00.0"});
  ExpectRejected("io { backend: \"nvme\" nvme_devices: \"01:00.0\" }", {"io.nvme_devices[0]"});
  ExpectRejected("io { backend: \"nvme\" nvme_devices: \"0000:01:00.0\" "
                 "nvme_devices: \"0000:01:00.0\" }",
                 {"io.nvme_devices[1]", "repeat"});
  ExpectRejected("io { backend: \"nvme\" nvme_devices: \"0000:01:00.0\" nvme_nsid: 0 }",
                 {"io.nvme_nsid"});
  ExpectRejected("io { backend: \"gds\" fallback: \"memory\" }", {"io.fallback", "fail"});
  ExpectRejected("io { backend: \"uring_cmd\" }", {"io.passthrough_devices", "/dev/ng0n1"});
  ExpectRejected("io { backend: \"uring_cmd\" passthrough_devices: \"ng0n1\" }",
                 {"io.passthrough_devices[0]"});
  ExpectRejected(
      "io { backend: \"uring_cmd\" passthrough_devices: \"/dev/ng0n1\" "
      "passthrough_devices: \"/dev/ng0n1\" }",
      {"io.passthrough_devices[1]", "repeat"});
  ExpectRejected("io { fallback: \"maybe\" }", {"io.fallback", "uring", "fail"});
  ExpectRejected("io { queue_depth: 0 }", {"io.queue_depth", "[1, 4096]"});
  ExpectRejected("io { queue_depth: 5000 }", {"io.queue_depth"});
  ExpectRejected("dram { capacity_bytes: 4096 }", {"dram.capacity_bytes", "0 (off)"});
  ExpectRejected("limits { max_blocks_per_call: 0 }", {"limits.max_blocks_per_call"});
  ExpectRejected("limits { session_ttl_ms: 0 }", {"limits.session_ttl_ms", "[100,"});
  ExpectRejected("limits { lease_ttl_ms: 10 }", {"limits.lease_ttl_ms"});
  ExpectRejected("limits { store_staging_bytes: 4096 }", {"limits.store_staging_bytes"});
  ExpectRejected("limits { max_sessions: 0 }", {"limits.max_sessions"});
  ExpectRejected("journal { checkpoint_every: 0 }", {"journal.checkpoint_every"});
  ExpectRejected("log_level: \"verbose\"", {"log_level", "trace", "error"});
}

TEST(ConfigTest, NvmeBackendWithItsDevices) {
  auto c = LoadConfig(
      "io { backend: \"nvme\" nvme_devices: \"0000:00:04.0\" nvme_devices: \"0000:3b:00.1\" }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->io().nvme_devices_size(), 2);
  EXPECT_EQ(c->io().nvme_nsid(), 1u);
}

TEST(ConfigTest, GpuSection) {
  ExpectRejected("gpu { mode: \"gpu\" }", {"gpu.mode", "auto", "cuda", "host"});
  ExpectRejected("gpu { mode: \"\" }", {"gpu.mode"});
  ExpectRejected("gpu { device: 64 }", {"gpu.device", "[0, 63]"});
  ExpectRejected("gpu { io_sm_count: 12 }", {"gpu.io_sm_count", "multiple of 8"});
  ExpectRejected("gpu { io_sm_count: 2048 }", {"gpu.io_sm_count", "1024"});
  ExpectRejected("gpu { copy_ctas: 70000 }", {"gpu.copy_ctas"});
  ExpectRejected("gpu { scatter: \"dma\" }",
                 {"gpu.scatter", "auto", "staged", "mapped", "copy_engine"});
  EXPECT_TRUE(LoadConfig("gpu { scatter: \"copy_engine\" }").ok());
  ExpectRejected("gpu { round_bytes: 2147483648 }", {"gpu.round_bytes"});
  ExpectRejected("gpu { max_staging_bytes: 4194304 }", {"gpu.max_staging_bytes"});
  ExpectRejected("gpu { max_staging_bytes: 17179869185 }", {"gpu.max_staging_bytes"});
  auto c = LoadConfig(
      "gpu { mode: \"cuda\" device: 3 io_sm_count: 0 copy_ctas: 8 scatter: \"mapped\" }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu().mode(), "cuda");
  EXPECT_EQ(c->gpu().device(), 3u);
  EXPECT_EQ(c->gpu().io_sm_count(), 0u);  // 0: an ordinary stream, not "use the default"
  EXPECT_EQ(c->gpu().copy_ctas(), 8u);
  EXPECT_EQ(c->gpu().scatter(), "mapped");
  EXPECT_TRUE(LoadConfig("gpu { mode: \"host\" io_sm_count: 128 }").ok());
}

TEST(ConfigTest, DatapathDecisionFields) {
  ExpectRejected("datapath { decision: \"always\" }", {"datapath.decision", "auto", "off"});
  ExpectRejected("datapath { decision_min_gain: 0.95 }", {"datapath.decision_min_gain", "0.9"});
  ExpectRejected("datapath { decision_min_gain: -0.1 }", {"datapath.decision_min_gain"});
  ExpectRejected("datapath { ssd_read_prior_bytes_per_sec: -1 }",
                 {"datapath.ssd_read_prior_bytes_per_sec", "1e6"});
  ExpectRejected("datapath { ssd_read_prior_bytes_per_sec: 100 }",
                 {"datapath.ssd_read_prior_bytes_per_sec"});
  ExpectRejected("datapath { dram_read_prior_bytes_per_sec: nan }",
                 {"datapath.dram_read_prior_bytes_per_sec"});
  ExpectRejected("datapath { dram_read_prior_bytes_per_sec: inf }",
                 {"datapath.dram_read_prior_bytes_per_sec"});
  auto c = LoadConfig(
      "datapath { decision: \"off\" ssd_read_prior_bytes_per_sec: 2.5e9 "
      "dram_read_prior_bytes_per_sec: 5e10 }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->datapath().decision(), "off");
  EXPECT_EQ(c->datapath().ssd_read_prior_bytes_per_sec(), 2.5e9);
  EXPECT_TRUE(LoadConfig("datapath { decision: \"auto\" }").ok());
  EXPECT_TRUE(LoadConfig("").ok()) << "absent: the defaults (auto, 1e9, 20e9)";
}

TEST(ConfigTest, WriteBacklogBoundsAndWriteCap) {
  auto c = LoadConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->datapath().max_write_backlog_bytes(), 0u);  // 0: limits.store_staging_bytes
  EXPECT_EQ(c->datapath().max_write_backlog_age_ms(), 10000u);
  EXPECT_EQ(c->datapath().write_bytes_in_flight_while_reading(), 1u << 20);
  // One default block is 64 x 32 KiB = 2 MiB; staging 256 MiB.
  ExpectRejected("datapath { max_write_backlog_bytes: 2097151 }",
                 {"datapath.max_write_backlog_bytes", "2097152", "pool.max_objects"});
  ExpectRejected("datapath { max_write_backlog_bytes: 268435457 }",
                 {"datapath.max_write_backlog_bytes", "limits.store_staging_bytes"});
  EXPECT_TRUE(LoadConfig("datapath { max_write_backlog_bytes: 268435456 }").ok());
  ExpectRejected("datapath { max_write_backlog_age_ms: 0 }",
                 {"datapath.max_write_backlog_age_ms", "[100, 3600000]"});
  ExpectRejected("datapath { write_bytes_in_flight_while_reading: 0 }",
                 {"datapath.write_bytes_in_flight_while_reading"});
  ExpectRejected("datapath { write_bytes_in_flight_while_reading: 2147483648 }",
                 {"datapath.write_bytes_in_flight_while_reading"});
  EXPECT_EQ(c->datapath().max_write_bytes_in_flight(), 64u << 20);
  EXPECT_EQ(c->datapath().write_latency_target_ms(), 10u);
  EXPECT_TRUE(LoadConfig("datapath { write_latency_target_ms: 0 }").ok());  // off
  ExpectRejected("datapath { write_latency_target_ms: 10001 }",
                 {"datapath.write_latency_target_ms", "[0, 10000]"});
  EXPECT_EQ(c->datapath().write_batches_in_flight(), 16u);
  EXPECT_TRUE(LoadConfig("datapath { write_batches_in_flight: 1 }").ok());
  ExpectRejected("datapath { write_batches_in_flight: 0 }",
                 {"datapath.write_batches_in_flight", "[1, 64]"});
  ExpectRejected("datapath { write_batches_in_flight: 65 }",
                 {"datapath.write_batches_in_flight", "[1, 64]"});
  EXPECT_EQ(c->datapath().verifier(), "auto");
  EXPECT_TRUE(LoadConfig("datapath { verifier: \"gpu\" }").ok());
  ExpectRejected("datapath { verifier: \"fpga\" }", {"datapath.verifier", "fpga"});
  EXPECT_EQ(c->datapath().store_checksums(), "auto");
  EXPECT_TRUE(LoadConfig("datapath { store_checksums: \"cpu\" }").ok());
  ExpectRejected("datapath { store_checksums: \"fpga\" }", {"datapath.store_checksums", "fpga"});
  // Unset: 64 MiB of slots shared out over the pool's devices, at least 8 MiB and 2 slots each.
  EXPECT_FALSE(c->datapath().has_read_bounce_depth());
  EXPECT_EQ(c->datapath().read_post_bytes(), 4u << 20);
  EXPECT_EQ(ReadBounceSlotBytes(*c), 4u << 20);
  const auto with_dirs = [](tutti::v1::Config config, int dirs) {
    config.mutable_pool()->clear_dirs();
    for (int i = 0; i < dirs; ++i) config.mutable_pool()->add_dirs(absl::StrCat("/d", i));
    return config;
  };
  for (const auto& [dirs, depth] : std::vector<std::pair<int, uint32_t>>{
           {0, 16}, {1, 16}, {2, 8}, {4, 4}, {5, 3}, {8, 2}, {16, 2}}) {
    EXPECT_EQ(ReadBounceDepth(with_dirs(*c, dirs)), depth) << dirs << " dirs, 4 MiB slots";
  }
  // 1 MiB slots: 64 at one device down to 8 a device (stop 55's rule).
  absl::StatusOr<tutti::v1::Config> small =
      LoadConfig("datapath { read_post_bytes: 1048576 max_read_bytes: 1048576 }");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(ReadBounceSlotBytes(*small), 1u << 20);
  for (const auto& [dirs, depth] :
       std::vector<std::pair<int, uint32_t>>{{1, 64}, {2, 32}, {4, 16}, {5, 12}, {8, 8}, {16, 8}}) {
    EXPECT_EQ(ReadBounceDepth(with_dirs(*small, dirs)), depth) << dirs << " dirs, 1 MiB slots";
  }
  // The slot is the larger of the two, rounded up to 4 KiB; never fewer than 2 a device.
  small = LoadConfig("datapath { read_post_bytes: 8192 max_read_bytes: 16777216 }");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(ReadBounceSlotBytes(*small), 16u << 20);
  EXPECT_EQ(ReadBounceDepth(with_dirs(*small, 1)), 4u);
  EXPECT_EQ(ReadBounceDepth(with_dirs(*small, 8)), 2u);
  // Reads in flight a device unless set: what the queue holds, at least 16 whole batches.
  EXPECT_EQ(c->datapath().max_read_bytes_in_flight(), 0u);
  EXPECT_EQ(c->io().queue_depth(), 64u);
  EXPECT_EQ(MaxReadBytesInFlight(*c), 64u << 20);  // 64 reads of 1 MiB, 16 batches of 4 MiB
  absl::StatusOr<tutti::v1::Config> inflight = LoadConfig("io { queue_depth: 16 }");
  ASSERT_TRUE(inflight.ok()) << inflight.status();
  EXPECT_EQ(MaxReadBytesInFlight(*inflight), 16u * (4u << 20));  // the batches decide
  inflight = LoadConfig("io { queue_depth: 128 }");
  ASSERT_TRUE(inflight.ok()) << inflight.status();
  EXPECT_EQ(MaxReadBytesInFlight(*inflight), 128u << 20);  // the queue decides
  inflight = LoadConfig(
      "io { queue_depth: 8 } datapath { read_post_bytes: 1048576 max_read_bytes: 2097152 }");
  ASSERT_TRUE(inflight.ok()) << inflight.status();
  EXPECT_EQ(MaxReadBytesInFlight(*inflight), 16u * (2u << 20));
  inflight = LoadConfig("datapath { max_read_bytes_in_flight: 12288 }");
  ASSERT_TRUE(inflight.ok()) << inflight.status();
  EXPECT_EQ(MaxReadBytesInFlight(*inflight), 12288u);
  absl::StatusOr<tutti::v1::Config> set = LoadConfig("datapath { read_bounce_depth: 32 }");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(ReadBounceDepth(*set), 32u);
  set = LoadConfig("datapath { read_bounce_depth: 0 }");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(ReadBounceDepth(*set), 0u);
  EXPECT_TRUE(LoadConfig("datapath { read_bounce_depth: 0 }").ok());  // whole layers in host memory
  ExpectRejected("datapath { read_bounce_depth: 1025 }",
                 {"datapath.read_bounce_depth", "[0, 1024]"});
  EXPECT_EQ(c->datapath().gpu_check_batch_objects(), 4096u);
  EXPECT_TRUE(LoadConfig("datapath { gpu_check_batch_objects: 512 }").ok());
  ExpectRejected("datapath { gpu_check_batch_objects: 8 }",
                 {"datapath.gpu_check_batch_objects", "[16, 65536]"});
  EXPECT_EQ(c->datapath().gpu_check_slots(), 2u);
  EXPECT_TRUE(LoadConfig("datapath { gpu_check_slots: 8 }").ok());
  ExpectRejected("datapath { gpu_check_slots: 1 }", {"datapath.gpu_check_slots", "[2, 16]"});
  ExpectRejected("datapath { gpu_check_slots: 17 }", {"datapath.gpu_check_slots", "[2, 16]"});
  EXPECT_EQ(c->datapath().gpu_check_shared_objects(), 0u);  // off
  EXPECT_TRUE(c->datapath().gpu_check_copy_on_arrival());  // on since stop 53's measurements
  EXPECT_FALSE(LoadConfig("datapath { gpu_check_copy_on_arrival: false }")
                  ->datapath()
                  .gpu_check_copy_on_arrival());
  EXPECT_TRUE(LoadConfig("datapath { gpu_check_shared_objects: 512 }").ok());
  ExpectRejected("datapath { gpu_check_shared_objects: 8 }",
                 {"datapath.gpu_check_shared_objects", "[16, 4096]"});
  ExpectRejected("datapath { gpu_check_batch_objects: 1024 gpu_check_shared_objects: 2048 }",
                 {"datapath.gpu_check_shared_objects", "[16, 1024]"});
  ExpectRejected("datapath { write_bytes_in_flight_while_reading: 2097152 "
                 "max_write_bytes_in_flight: 1048576 }",
                 {"datapath.max_write_bytes_in_flight", "1048576", "2097152"});
  ExpectRejected("datapath { max_write_bytes_in_flight: 2147483648 }",
                 {"datapath.max_write_bytes_in_flight"});
  EXPECT_TRUE(LoadConfig("datapath { write_bytes_in_flight_while_reading: 1048576 "
                         "max_write_bytes_in_flight: 1048576 }")
                  .ok());
}

TEST(ConfigTest, RetrieveStagingMustHoldOneLayerOfAMaximalCall) {
  // 2048 blocks x 2 x 32 KiB = 128 MiB.
  ExpectRejected("limits { retrieve_staging_bytes: 134217727 }",
                 {"limits.retrieve_staging_bytes", "134217728", "max_blocks_per_call"});
  EXPECT_TRUE(LoadConfig("limits { retrieve_staging_bytes: 134217728 }").ok());
  ExpectRejected("limits { max_blocks_per_call: 8192 retrieve_staging_bytes: 268435456 }",
                 {"limits.retrieve_staging_bytes"});
}

TEST(ConfigTest, StagingDefaultsGrowWithThePoolsDevices) {
  auto staging = [](const std::string& text) {
    absl::StatusOr<v1::Config> c = LoadConfig(text);
    EXPECT_TRUE(c.ok()) << text << ": " << c.status();
    return c.ok() ? std::make_pair(c->limits().store_staging_bytes(),
                                   c->limits().retrieve_staging_bytes())
                  : std::make_pair(uint64_t{0}, uint64_t{0});
  };
  const uint64_t MiB = 1 << 20;
  using P = std::pair<uint64_t, uint64_t>;
  EXPECT_EQ(staging(""), P(256 * MiB, 256 * MiB));  // no dirs: the state dir's pool, one device
  EXPECT_EQ(staging("pool { dirs: \"/a\" dirs: \"/b\" }"), P(512 * MiB, 512 * MiB));
  EXPECT_EQ(staging("pool { dirs: \"/a\" dirs: \"/b\" dirs: \"/c\" dirs: \"/d\" }"),
            P(1024 * MiB, 1024 * MiB));
  std::string eight = "pool {";
  for (int i = 0; i < 8; ++i) eight += " dirs: \"/d" + std::to_string(i) + "\"";
  EXPECT_EQ(staging(eight + " }"), P(1024 * MiB, 1024 * MiB));  // at most 1 GiB
  // The NVMe backends count their devices, not directories.
  EXPECT_EQ(staging("io { backend: \"uring_cmd\" passthrough_devices: \"/dev/ng0n1\" "
                    "passthrough_devices: \"/dev/ng1n1\" }"),
            P(512 * MiB, 512 * MiB));
  // A value given is kept; automatic staging never falls below what one call needs.
  EXPECT_EQ(staging("pool { dirs: \"/a\" dirs: \"/b\" } limits { store_staging_bytes: "
                    "268435456 }"),
            P(256 * MiB, 512 * MiB));
  EXPECT_EQ(staging("limits { max_blocks_per_call: 8192 }"), P(256 * MiB, 512 * MiB));
}

TEST(ConfigTest, MetricsListenIsHostPortOrOff) {
  EXPECT_EQ(DefaultConfig().metrics().listen(), "127.0.0.1:9464");
  for (const char* ok : {"", "off", "127.0.0.1:9464", "localhost:0", "0.0.0.0:65535"}) {
    auto c = LoadConfig(absl::StrCat("metrics { listen: \"", ok, "\" }"));
    ASSERT_TRUE(c.ok()) << ok << ": " << c.status();
    EXPECT_EQ(c->metrics().listen(), ok);
  }
  for (const char* bad : {"9464", ":9464", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:94a4",
                          "::1:9464", "[::1]:9464", "999.1.1.1:9464", "1.2.3:9464", "1.2.3.4.5:1",
                          "1..2.3:1", "example.com:9464", "127.0.0.1:1234567"}) {
    ExpectRejected(absl::StrCat("metrics { listen: \"", bad, "\" }"),
                   {"metrics.listen", bad, "HOST:PORT"});
  }
}

TEST(ConfigTest, RenderShowsEveryFieldAndReloads) {
  auto c = LoadConfig("dram { capacity_bytes: 0 } pool { dirs: \"/ssd0\" }");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string text = RenderConfig(*c);
  EXPECT_THAT(text, HasSubstr("socket_mode: 0660"));
  EXPECT_THAT(text, HasSubstr("capacity_bytes: 0"));  // zero values shown too
  EXPECT_THAT(text, HasSubstr("dirs: \"/ssd0\""));
  EXPECT_THAT(text, HasSubstr("log_level: \"info\""));
  // An unset field with presence stays unset (read_bounce_depth: its share of 64 a device).
  EXPECT_THAT(text, HasSubstr("# read_bounce_depth: unset"));
  // The rendering is itself a config file that yields the same config.
  auto again = LoadConfig(text);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << text;
  EXPECT_EQ(again->SerializeAsString(), c->SerializeAsString());
}

TEST(ConfigTest, MaxReadBytesIsAMultipleOf4096From4KiBTo64MiB) {
  for (const char* bad : {"0", "4095", "6000", "67112960"}) {
    ExpectRejected(std::string("datapath { max_read_bytes: ") + bad + " }",
                   {"datapath.max_read_bytes", bad, "multiple of 4096"});
  }
  for (uint64_t good : {4096ull, 1ull << 20, 64ull << 20}) {
    auto c = LoadConfig("datapath { max_read_bytes: " + std::to_string(good) + " }");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->datapath().max_read_bytes(), good);
  }
}

}  // namespace
}  // namespace tutti::config

// The operator API over a unix socket, against the real store, plus the standard health service.
#include "daemon/server/admin_service.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "daemon/pool/layout.h"
#include "daemon/server/engine_cpus.h"
#include "daemon/server/service_test_env.h"
#include "daemon/server/stats_fields.h"
#include "gmock/gmock.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

class AdminServiceTest : public ::testing::Test {
 protected:
  // Stores `n` blocks from `engine` under keys base.. and pins the first `pinned` by a Lookup.
  void StoreAndPin(uint64_t session, uint64_t base, uint32_t n, uint32_t pinned) {
    tutti::v1::StoreRequest req;
    env_.Name(session, &req);
    req.set_wait_durable(true);
    for (uint32_t i = 0; i < n; ++i) {
      auto* bp = req.add_blocks();
      bp->set_key(KeyBytes(base + i));
      bp->set_engine_block(i);
    }
    grpc::ClientContext c1;
    tutti::v1::StoreResponse sr;
    ASSERT_TRUE(env_.kv().Store(&c1, req, &sr).ok());
    if (pinned == 0) return;
    tutti::v1::LookupRequest lr;
    env_.Name(session, &lr);
    for (uint32_t i = 0; i < pinned; ++i) lr.add_keys(KeyBytes(base + i));
    grpc::ClientContext c2;
    tutti::v1::LookupResponse lresp;
    ASSERT_TRUE(env_.kv().Lookup(&c2, lr, &lresp).ok());
    ASSERT_EQ(lresp.hits(), pinned);
  }

  ServiceEnv env_;
};

// Waits for the next completion of `cq` and returns its ok bit.
bool Await(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq->Next(&tag, &ok) && ok;
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

TEST_F(AdminServiceTest, StatusSessionsAndStats) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreAndPin(session, 50, 3, 2);

  grpc::ClientContext c1;
  tutti::v1::StatusResponse st;
  ASSERT_TRUE(env_.admin().Status(&c1, {}, &st).ok());
  EXPECT_EQ(st.version(), "test");
  EXPECT_EQ(st.io_backend(), "memory");
  EXPECT_EQ(st.device_mode(), "host");
  EXPECT_EQ(st.sessions(), 1u);
  EXPECT_EQ(st.slots_used(), 3u);
  EXPECT_GT(st.slots_total(), 3u);
  EXPECT_GT(st.capacity_bytes(), st.used_bytes());
  EXPECT_GT(st.used_bytes(), 0u);
  EXPECT_EQ(st.pool_dirs_size(), 1);
  EXPECT_EQ(st.gpu_memory_bytes(), 0u);  // host mode

  grpc::ClientContext c2;
  tutti::v1::SessionsResponse ss;
  ASSERT_TRUE(env_.admin().Sessions(&c2, {}, &ss).ok());
  ASSERT_EQ(ss.sessions_size(), 1);
  EXPECT_EQ(ss.sessions(0).session_id(), session);
  EXPECT_EQ(ss.sessions(0).engine_id(), "test-engine");
  EXPECT_EQ(ss.sessions(0).model_id(), "test-model");
  EXPECT_EQ(ss.sessions(0).leases(), 1u);
  EXPECT_EQ(ss.sessions(0).pinned_blocks(), 2u);
  EXPECT_EQ(ss.sessions(0).num_blocks(), kEngineBlocks);
  EXPECT_NE(ss.sessions(0).namespace_id(), 0u);
  // The engine is this process, as the handoff socket saw it: its CPUs are all tuttid's too.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  EXPECT_EQ(ss.sessions(0).engine_cpus(), CpuList(mine));
  EXPECT_EQ(ss.sessions(0).cpus_shared_with_tuttid(), static_cast<uint32_t>(CPU_COUNT(&mine)));

  grpc::ClientContext c3;
  tutti::v1::StatsResponse stats;
  ASSERT_TRUE(env_.admin().Stats(&c3, {}, &stats).ok());
  EXPECT_EQ(stats.blocks_stored(), 3u);
  EXPECT_EQ(stats.lookups(), 1u);
  EXPECT_EQ(stats.lookup_hits(), 2u);
  EXPECT_EQ(stats.sessions(), 1u);
  ASSERT_EQ(stats.namespaces_size(), 1);
  EXPECT_EQ(stats.namespaces(0).model_id(), "test-model");
  EXPECT_EQ(stats.namespaces(0).blocks_ssd(), 3u);
  EXPECT_EQ(stats.namespaces(0).lookup_hits(), 2u);
  EXPECT_EQ(stats.namespaces(0).lookup_misses(), stats.lookup_misses());
  EXPECT_EQ(stats.namespaces(0).namespace_id(), ss.sessions(0).namespace_id());
  EXPECT_EQ(stats.gpu_layers(), 0u);  // host mode
}

// Stats reads the stats registry: every field a registered family names is a figure field of
// StatsResponse (or of StatusResponse), and every family is listed with its samples.
TEST_F(AdminServiceTest, StatsCarriesTheRegistrysNamedFieldsAndEveryFamily) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreAndPin(session, 50, 3, 2);
  const std::vector<stats::Family> families = env_.stats().Collect();
  std::vector<std::string> unknown =
      UnknownFields(families, *tutti::v1::StatsResponse::descriptor());
  std::vector<std::string> not_status =
      UnknownFields(families, *tutti::v1::StatusResponse::descriptor());
  unknown.erase(std::remove_if(unknown.begin(), unknown.end(),
                               [&](const std::string& f) {  // Status-only fields are fine
                                 return std::find(not_status.begin(), not_status.end(), f) ==
                                        not_status.end();
                               }),
                unknown.end());
  EXPECT_THAT(unknown, ::testing::IsEmpty());

  grpc::ClientContext ctx;
  tutti::v1::StatsResponse stats;
  ASSERT_TRUE(env_.admin().Stats(&ctx, {}, &stats).ok());
  ASSERT_EQ(stats.metrics_size(), static_cast<int>(families.size()));
  for (int i = 0; i < stats.metrics_size(); ++i) {
    EXPECT_EQ(stats.metrics(i).name(), families[i].spec.name);
    EXPECT_FALSE(stats.metrics(i).help().empty());
  }
  auto value = [&stats](const std::string& name) {
    for (const tutti::v1::MetricFamily& f : stats.metrics()) {
      if (f.name() == name && f.samples_size() > 0) return f.samples(0).value();
    }
    return -1.0;
  };
  EXPECT_EQ(value("tutti_stored_blocks_total"), stats.blocks_stored());
  EXPECT_EQ(value("tutti_stored_blocks_total"), 3);
  EXPECT_EQ(value("tutti_sessions"), 1);
  EXPECT_EQ(value("tutti_pool_capacity_bytes"), stats.capacity_bytes());
  EXPECT_EQ(stats.blocks_retrieved(), 0u);
  EXPECT_EQ(stats.write_backlog_age_ms(), 0u);
}

TEST(AdminServiceGpuTest, StatsReadsTheCopierCountsAtEachCall) {
  GpuLayerCounts counts;
  EnvOptions options;
  options.gpu_layers = [&counts] { return counts; };
  ServiceEnv env(options);
  for (const GpuLayerCounts& now : {GpuLayerCounts{10, 4, 3, 3}, GpuLayerCounts{42, 40, 5, 0}}) {
    counts = now;
    grpc::ClientContext ctx;
    tutti::v1::StatsResponse stats;
    ASSERT_TRUE(env.admin().Stats(&ctx, {}, &stats).ok());
    EXPECT_EQ(stats.gpu_layers(), now.layers);
    EXPECT_EQ(stats.gpu_layers_copy_engine(), now.by_copy_engine);
    EXPECT_EQ(stats.gpu_gathers(), now.gathers);
    EXPECT_EQ(stats.gpu_gathers_copy_engine(), now.gathers_by_copy_engine);
  }
}

TEST(AdminServiceGpuTest, StatusReportsTheGpuMemoryTakenAtStart) {
  EnvOptions options;
  options.gpu_memory_bytes = 300ull << 20;
  ServiceEnv env(options);
  grpc::ClientContext ctx;
  tutti::v1::StatusResponse st;
  ASSERT_TRUE(env.admin().Status(&ctx, {}, &st).ok());
  EXPECT_EQ(st.gpu_memory_bytes(), 300ull << 20);
}

TEST_F(AdminServiceTest, EvictGuardsAndSkipsPinned) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreAndPin(session, 60, 4, 1);
  tutti::v1::EvictResponse er;

  grpc::ClientContext c1;
  tutti::v1::EvictRequest all_unguarded;
  grpc::Status s = env_.admin().Evict(&c1, all_unguarded, &er);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("all = true"));

  grpc::ClientContext c2;
  tutti::v1::EvictRequest unknown;
  unknown.set_namespace_id(12345);
  EXPECT_EQ(env_.admin().Evict(&c2, unknown, &er).error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext c3;
  tutti::v1::EvictRequest one;
  one.set_namespace_id(env_.sessions().List()[0].ns);
  ASSERT_TRUE(env_.admin().Evict(&c3, one, &er).ok());
  EXPECT_EQ(er.evicted(), 3u);
  EXPECT_EQ(er.skipped_pinned(), 1u);
}

// Issue 19: the operator ends a pin hog's leases (the engine stays), or the whole session.
TEST_F(AdminServiceTest, EndSessionEndsTheLeasesOrTheSession) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreAndPin(session, 70, 4, 3);
  grpc::ClientContext c0;
  tutti::v1::SessionsResponse ss;
  ASSERT_TRUE(env_.admin().Sessions(&c0, {}, &ss).ok());
  ASSERT_EQ(ss.sessions_size(), 1);
  EXPECT_EQ(ss.sessions(0).uid(), getuid());

  tutti::v1::EndSessionRequest leases;
  leases.set_session_id(session);
  leases.set_leases_only(true);
  tutti::v1::EndSessionResponse r;
  grpc::ClientContext c1;
  ASSERT_TRUE(env_.admin().EndSession(&c1, leases, &r).ok());
  EXPECT_EQ(r.leases_ended(), 1u);
  EXPECT_EQ(r.pins_released(), 3u);
  EXPECT_FALSE(r.session_closed());
  ASSERT_EQ(env_.sessions().List().size(), 1u);
  EXPECT_EQ(env_.sessions().List()[0].pinned_blocks, 0u);
  EXPECT_EQ(env_.store().Evict(0), (std::pair<uint64_t, uint64_t>{4, 0})) << "nothing pinned";

  tutti::v1::EndSessionRequest whole;
  whole.set_session_id(session);
  grpc::ClientContext c2;
  ASSERT_TRUE(env_.admin().EndSession(&c2, whole, &r).ok());
  EXPECT_TRUE(r.session_closed());
  EXPECT_EQ(env_.sessions().num_sessions(), 0u);
  grpc::ClientContext c3;
  EXPECT_EQ(env_.admin().EndSession(&c3, whole, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext c4;
  EXPECT_EQ(env_.admin().EndSession(&c4, tutti::v1::EndSessionRequest(), &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(AdminServiceTest, HealthServiceAnswersServing) {
  grpc::GenericStub stub(env_.channel());
  grpc::ClientContext ctx;
  grpc::ByteBuffer request(nullptr, 0), response;  // HealthCheckRequest{service: ""}
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Bytes(response), std::string("\x08\x01", 2));  // status: SERVING
}

TEST_F(AdminServiceTest, ReflectionListsTheServices) {
  grpc::GenericStub stub(env_.channel());
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(nullptr);
  ASSERT_TRUE(Await(&cq));
  grpc::Slice list_services(
      std::string("\x3a\x00", 2));  // ServerReflectionRequest{list_services: ""}
  call->Write(grpc::ByteBuffer(&list_services, 1), nullptr);
  ASSERT_TRUE(Await(&cq));
  call->WritesDone(nullptr);
  ASSERT_TRUE(Await(&cq));
  grpc::ByteBuffer response;
  call->Read(&response, nullptr);
  ASSERT_TRUE(Await(&cq));
  grpc::Status status;
  call->Finish(&status, nullptr);
  ASSERT_TRUE(Await(&cq));
  EXPECT_TRUE(status.ok()) << status.error_message();
  const std::string bytes = Bytes(response);
  EXPECT_THAT(bytes, ::testing::HasSubstr("tutti.v1.KvCache"));
  EXPECT_THAT(bytes, ::testing::HasSubstr("tutti.v1.Admin"));
  EXPECT_THAT(bytes, ::testing::HasSubstr("grpc.health.v1.Health"));
  cq.Shutdown();
  while (Await(&cq)) {
  }
}

}  // namespace
}  // namespace tutti::server::testing

namespace tutti::server::testing {
namespace {

// The store's layout in ServiceEnv (service_test_env.cc): 64 MiB over 2 files, 8 objects a slot.
pool::PoolLayout EnvLayout() { return *pool::PoolLayout::Compute(64ull << 20, 2, 4096, 8); }

// Whether `key` alone is found by a Lookup of `session` (its lease is dropped again).
bool Found(ServiceEnv& env, uint64_t session, uint64_t key) {
  tutti::v1::LookupRequest lr;
  env.Name(session, &lr);
  lr.add_keys(KeyBytes(key));
  grpc::ClientContext ctx;
  tutti::v1::LookupResponse resp;
  EXPECT_TRUE(env.kv().Lookup(&ctx, lr, &resp).ok());
  if (resp.hits() > 0) {
    tutti::v1::ReleaseRequest rel;
    env.Name(session, &rel);
    rel.set_lease_id(resp.lease_id());
    grpc::ClientContext c2;
    tutti::v1::ReleaseResponse rr;
    EXPECT_TRUE(env.kv().Release(&c2, rel, &rr).ok());
  }
  return resp.hits() == 1;
}

class AdminOpsTest : public AdminServiceTest {};

TEST_F(AdminOpsTest, VerifyStreamsProgressAndDropsExactlyTheCorruptBlock) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreAndPin(session, 70, 5, 0);
  const pool::Location loc = EnvLayout().ObjectLocation(2, 1);
  env_.backend().disk().Corrupt(loc.file, loc.offset + 9, 1);

  tutti::v1::VerifyRequest req;
  req.set_batch_blocks(2);
  grpc::ClientContext ctx;
  auto reader = env_.admin().Verify(&ctx, req);
  std::vector<tutti::v1::VerifyProgress> msgs;
  tutti::v1::VerifyProgress msg;
  while (reader->Read(&msg)) msgs.push_back(msg);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(msgs.size(), 4u) << "3 batches of at most 2, then the summary";
  EXPECT_EQ(msgs[0].blocks_checked(), 2u);
  EXPECT_EQ(msgs[2].blocks_checked(), 5u);
  const tutti::v1::VerifyProgress& last = msgs.back();
  EXPECT_TRUE(last.done());
  EXPECT_EQ(last.blocks_total(), 5u);
  EXPECT_EQ(last.blocks_checked(), 5u);
  EXPECT_EQ(last.blocks_bad(), 1u);
  ASSERT_EQ(last.bad_size(), 1);
  EXPECT_EQ(last.bad(0).slot(), 2u);
  EXPECT_EQ(last.bad(0).reason(), "object checksum mismatch");
  EXPECT_GT(last.bytes_read(), 0u);
  int missing = 0;
  for (uint64_t k = 70; k < 75; ++k) missing += !Found(env_, session, k);
  EXPECT_EQ(missing, 1) << "only the corrupt block is gone";
}

TEST_F(AdminOpsTest, DrainWaitsForTheBacklogAndReportsIt) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  env_.backend().SetPaused(true);
  tutti::v1::StoreRequest sreq;
  env_.Name(session, &sreq);
  for (uint32_t i = 0; i < 3; ++i) {
    auto* bp = sreq.add_blocks();
    bp->set_key(KeyBytes(80 + i));
    bp->set_engine_block(i);
  }
  grpc::ClientContext c1;
  tutti::v1::StoreResponse sresp;
  ASSERT_TRUE(env_.kv().Store(&c1, sreq, &sresp).ok());

  tutti::v1::DrainRequest req;
  req.set_timeout_ms(20);
  grpc::ClientContext c2;
  tutti::v1::DrainResponse held;
  ASSERT_TRUE(env_.admin().Drain(&c2, req, &held).ok());
  EXPECT_FALSE(held.drained());
  EXPECT_EQ(held.backlog_blocks_before(), 3u);
  EXPECT_EQ(held.backlog_blocks_after(), 3u);
  EXPECT_GT(held.backlog_bytes_before(), 0u);

  env_.backend().SetPaused(false);
  req.set_timeout_ms(30000);
  grpc::ClientContext c3;
  tutti::v1::DrainResponse done;
  ASSERT_TRUE(env_.admin().Drain(&c3, req, &done).ok());
  EXPECT_TRUE(done.drained());
  EXPECT_EQ(done.backlog_blocks_after(), 0u);
  EXPECT_EQ(done.backlog_bytes_after(), 0u);
  EXPECT_TRUE(Found(env_, session, 80));
}

TEST_F(AdminOpsTest, ReportDevicesKeepsTheHealthAndRefusesBadNames) {
  tutti::v1::ReportDevicesRequest req;
  tutti::v1::NvmeDeviceHealth* d = req.add_devices();
  d->set_device("nvme0n1");
  d->set_model("QEMU NVMe Ctrl");
  d->set_serial("deadbeef");
  d->set_critical_warning(4);
  d->set_temperature_c(50);
  tutti::v1::ReportDevicesResponse resp;
  grpc::ClientContext c1;
  ASSERT_TRUE(env_.admin().ReportDevices(&c1, req, &resp).ok());
  const std::vector<DeviceHealth> board = env_.device_health().Snapshot();
  ASSERT_EQ(board.size(), 1u);
  EXPECT_EQ(board[0].device, "nvme0n1");
  EXPECT_EQ(board[0].critical_warning, 4u);
  EXPECT_EQ(board[0].temperature_c, 50);

  d->set_device("nvme\n0");
  grpc::ClientContext c2;
  grpc::Status s = env_.admin().ReportDevices(&c2, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("devices[0].device"), std::string::npos) << s.error_message();
  d->set_device("");
  grpc::ClientContext c3;
  EXPECT_EQ(env_.admin().ReportDevices(&c3, req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(env_.device_health().Snapshot().size(), 1u) << "a refused report changes nothing";
}

TEST_F(AdminOpsTest, ConfigAnswersTheEffectiveConfigurationText) {
  grpc::ClientContext ctx;
  tutti::v1::ConfigResponse resp;
  ASSERT_TRUE(env_.admin().Config(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.text(), "pool {\n  dirs: \"test\"\n}\n");
}

TEST_F(AdminOpsTest, SetLogLevelChangesOneSubsystemAndRefusesUnknownNames) {
  tutti::log::Get("store");  // the store logs at start; make sure it exists in this process
  tutti::v1::SetLogLevelRequest req;
  req.set_subsystem("store");
  req.set_level("debug");
  grpc::ClientContext c1;
  tutti::v1::SetLogLevelResponse resp;
  ASSERT_TRUE(env_.admin().SetLogLevel(&c1, req, &resp).ok());
  EXPECT_EQ(resp.previous_level(), "info");
  EXPECT_EQ(tutti::log::Get("store")->level(), spdlog::level::debug);
  EXPECT_EQ(tutti::log::Get("server")->level(), spdlog::level::info)
      << "other subsystems keep theirs";

  req.set_subsystem("no-such-subsystem");
  grpc::ClientContext c2;
  grpc::Status s = env_.admin().SetLogLevel(&c2, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("store"), std::string::npos) << s.error_message();

  req.set_subsystem("store");
  req.set_level("loud");
  grpc::ClientContext c3;
  EXPECT_EQ(env_.admin().SetLogLevel(&c3, req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  req.set_subsystem("all");
  req.set_level("info");
  grpc::ClientContext c4;
  ASSERT_TRUE(env_.admin().SetLogLevel(&c4, req, &resp).ok());
  EXPECT_EQ(tutti::log::Get("store")->level(), spdlog::level::info);
}

}  // namespace
}  // namespace tutti::server::testing

// The "nvme" backend over the driver and the software controller model: bytes through the
// registered region and through the bounce buffer, requests split at max transfer, per-request
// errors, a batch's requests in their order, Sync as Flush, two devices as two files.
#include "daemon/io/nvme_backend.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include "daemon/io/aligned_buffer.h"
#include "daemon/io/nvme/model/controller_model.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

using nvme::ControllerModel;

class NvmeBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      nvme::ModelOptions mo;
      mo.namespace_blocks = 4096 + i * 1024;
      mo.lba_shift = i == 0 ? 12 : 9;
      models_.push_back(ControllerModel::Create(mo).value());
      nvme::ControllerOptions co;
      co.name = "nvme" + std::to_string(i);
      co.io_queue_depth = 16;
      controllers_.push_back(
          nvme::Controller::Create(co, models_[i].get(), models_[i].get()).value());
      devices_.push_back({controllers_[i].get(), models_[i].get()});
    }
    backend_ = NvmeBackend::Create({/*bounce_bytes=*/256 << 10}, devices_).value();
  }
  void TearDown() override {
    backend_.reset();
    controllers_.clear();
  }
  static void Fill(uint8_t* p, uint64_t n, uint8_t seed) {
    for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7 + i / 4096);
  }

  std::vector<std::unique_ptr<ControllerModel>> models_;
  std::vector<std::unique_ptr<nvme::Controller>> controllers_;
  std::vector<NvmeBackendDevice> devices_;
  std::unique_ptr<NvmeBackend> backend_;
};

TEST_F(NvmeBackendTest, FilesAreNamespaces) {
  EXPECT_EQ(backend_->name(), "nvme");
  ASSERT_EQ(backend_->num_files(), 2u);
  EXPECT_EQ(backend_->file_size(0), 4096u * 4096);
  EXPECT_EQ(backend_->file_size(1), 5120u * 512);
}

// 1 MiB requests (8 commands each at 128 KiB) from the registered region and from plain memory
// (through a 256 KiB bounce buffer), on both files; read back into the other kind of memory.
TEST_F(NvmeBackendTest, RoundTripDirectAndBounced) {
  AlignedBuffer staging(4 << 20), plain(4 << 20);
  ASSERT_TRUE(backend_->RegisterBuffer(absl::MakeSpan(staging.data(), staging.size())).ok());
  Fill(staging.data(), 1 << 20, 1);
  Fill(plain.data(), 1 << 20, 2);
  std::vector<IoRequest> writes = {
      {Op::kWrite, 0, 0, staging.data(), 1 << 20},
      {Op::kWrite, 1, 1 << 20, plain.data(), 1 << 20},
  };
  backend_->Execute(absl::MakeSpan(writes));
  for (const auto& w : writes) ASSERT_EQ(w.result, 1 << 20);
  EXPECT_GE(models_[1]->counters().writes, 8u);
  std::vector<IoRequest> reads = {
      {Op::kRead, 0, 0, plain.data() + (2 << 20), 1 << 20},
      {Op::kRead, 1, 1 << 20, staging.data() + (2 << 20), 1 << 20},
  };
  backend_->Execute(absl::MakeSpan(reads));
  for (const auto& r : reads) ASSERT_EQ(r.result, 1 << 20);
  EXPECT_EQ(std::memcmp(plain.data() + (2 << 20), staging.data(), 1 << 20), 0);
  EXPECT_EQ(std::memcmp(staging.data() + (2 << 20), plain.data(), 1 << 20), 0);
  // On the media at the right LBAs (file 1 has 512-byte LBAs: byte 1 MiB is LBA 2048).
  EXPECT_EQ(std::memcmp(models_[1]->namespace_data() + (1 << 20), plain.data(), 1 << 20), 0);
}

TEST_F(NvmeBackendTest, ErrorsPerRequest) {
  AlignedBuffer buf(64 << 10);
  models_[0]->AddFault(
      {false, nvme::kNvmRead, 2, nvme::FaultAction::kStatus, nvme::kStatusUnrecoveredRead, 1});
  std::vector<IoRequest> batch = {
      {Op::kRead, 0, 0, buf.data(), 4096},
      {Op::kRead, 0, 2 * 4096, buf.data() + 4096, 4096},         // the media error
      {Op::kRead, 0, 100, buf.data() + 8192, 4096},              // unaligned
      {Op::kRead, 0, backend_->file_size(0), buf.data(), 4096},  // past the end
      {Op::kRead, 5, 0, buf.data(), 4096},                       // no such file
  };
  backend_->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(batch[0].result, 4096);
  EXPECT_EQ(batch[1].result, -EIO);
  EXPECT_EQ(batch[2].result, -EINVAL);
  EXPECT_EQ(batch[3].result, -EINVAL);
  EXPECT_EQ(batch[4].result, -EINVAL);
}

// The model executes commands in the order it fetches them: the issue order shows in the data.
TEST_F(NvmeBackendTest, RequestsOfABatchAreIssuedInOrder) {
  AlignedBuffer old_data(4096), new_data(4096), seen(4096);
  Fill(old_data.data(), 4096, 3);
  Fill(new_data.data(), 4096, 4);
  IoRequest first{Op::kWrite, 0, 0, old_data.data(), 4096};
  backend_->Execute(absl::MakeSpan(&first, 1));
  std::vector<IoRequest> batch = {{Op::kWrite, 0, 0, new_data.data(), 4096},
                                  {Op::kRead, 0, 0, seen.data(), 4096}};
  backend_->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(std::memcmp(seen.data(), new_data.data(), 4096), 0);
}

TEST_F(NvmeBackendTest, SyncFlushes) {
  EXPECT_TRUE(backend_->Sync(0).ok());
  EXPECT_EQ(models_[0]->counters().flushes, 1u);
  EXPECT_EQ(models_[1]->counters().flushes, 0u);
  EXPECT_EQ(backend_->Sync(2).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::io

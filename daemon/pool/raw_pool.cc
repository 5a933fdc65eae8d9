#include "daemon/pool/raw_pool.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/pool/superblock.h"

namespace tutti::pool {
namespace {

struct Signature {
  size_t offset;
  const char* bytes;
  size_t len;
  const char* what;
};

// Where common on-disk formats put their magic (libblkid's tables), within kRawProbeBytes.
constexpr Signature kSignatures[] = {
    {1080, "\x53\xef", 2, "an ext2/3/4 filesystem"},
    {0, "XFSB", 4, "an XFS filesystem"},
    {65600, "_BHRfS_M", 8, "a btrfs filesystem"},
    {0, "LUKS\xba\xbe", 6, "a LUKS volume"},
    {512, "EFI PART", 8, "a GPT partition table"},
    {4096, "EFI PART", 8, "a GPT partition table"},
    {512, "LABELONE", 8, "an LVM physical volume"},
    {4086, "SWAPSPACE2", 10, "a swap area"},
    {3, "NTFS    ", 8, "an NTFS filesystem"},
    {510, "\x55\xaa", 2, "a DOS partition table or boot sector"},
};

std::string EraseAdvice(const std::string& field) {
  return "tuttid never overwrites it. If nothing on it is needed, erase its first 1 MiB (for "
         "/dev/ngXnY: dd if=/dev/zero of=/dev/nvmeXnY bs=1M count=1 oflag=direct, or nvme "
         "format), or fix " + field;
}

absl::Status Transfer(io::IoBackend* io, io::Op op, uint32_t ns, uint8_t* buf, uint32_t len,
                      const std::string& device) {
  io::IoRequest r{op, ns, 0, buf, len};
  io->Execute(absl::MakeSpan(&r, 1));
  if (r.result == static_cast<int64_t>(len)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      device, ": ", op == io::Op::kRead ? "reading" : "writing", " the first ", len, " bytes: ",
      r.result < 0 ? std::strerror(static_cast<int>(-r.result)) : "short transfer"));
}

// One namespace as found: a superblock, or fresh (`fresh`), or an error saying what it holds.
struct Found {
  bool fresh = false;
  Superblock sb;
};

absl::StatusOr<Found> Inspect(io::IoBackend* io, uint32_t ns, const std::string& device,
                              const std::string& field) {
  io::AlignedBuffer buf(kRawProbeBytes);
  RETURN_IF_ERROR(Transfer(io, io::Op::kRead, ns, buf.data(), kRawProbeBytes, device));
  Found f;
  if (HasPoolMagic(buf.data())) {
    auto sb = DecodeSuperblock(buf.data(), device);
    if (!sb.ok()) {
      return absl::Status(sb.status().code(),
                          absl::StrCat(sb.status().message(), ". On a raw namespace: ",
                                       EraseAdvice(field)));
    }
    f.sb = *sb;
    return f;
  }
  const std::string what = ForeignContents(buf.data(), kRawProbeBytes);
  if (!what.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(device, " holds ", what, ", not a tutti pool: ", EraseAdvice(field)));
  }
  f.fresh = true;
  return f;
}

absl::StatusOr<RawPool> Create(io::IoBackend* io, const std::vector<std::string>& devices,
                               const PoolLayout& layout) {
  RawPool pool;
  ASSIGN_OR_RETURN(pool.uuid, NewUuid());
  io::AlignedBuffer page(kSuperblockBytes);
  for (uint32_t i = io->num_files(); i-- > 0;) {  // namespace 0 last: it completes the creation
    EncodeSuperblock(FromLayout(layout, i, pool.uuid), page.data());
    RETURN_IF_ERROR(Transfer(io, io::Op::kWrite, i, page.data(), kSuperblockBytes, devices[i]));
    absl::Status s = io->Sync(i);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat(devices[i], ": ", s.message()));
  }
  pool.created = true;
  return pool;
}

absl::Status Check(const Superblock& have, const PoolLayout& layout, uint32_t i,
                   const Superblock& first, const std::string& device, const std::string& field) {
  if (const std::string diff = LayoutDifferences(have, FromLayout(layout, i, {})); !diff.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, " holds a pool of another layout (", diff,
        "). Restore pool.capacity_bytes, pool.object_bytes, pool.max_objects, pool.extent_slots "
        "and ", field, " to the values it was created with, or erase the first 1 MiB "
        "of every namespace of the pool to start an empty one"));
  }
  if (have.file_index != i) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, " is namespace ", have.file_index, " of its pool but ", field,
        " lists it as ", i, ": restore the order of ", field));
  }
  if (i > 0 && have.uuid != first.uuid) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, " belongs to pool ", Hex(have.uuid), ", the first namespace to pool ",
        Hex(first.uuid), ": ", field, " mixes two pools"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RawPool::UuidHex() const { return Hex(uuid); }

uint64_t RawPoolCapacity(uint64_t configured, absl::Span<const uint64_t> namespace_bytes) {
  if (namespace_bytes.empty()) return 0;
  const uint64_t smallest = *std::min_element(namespace_bytes.begin(), namespace_bytes.end());
  const uint64_t n = namespace_bytes.size();
  return smallest > configured / n ? configured : smallest * n;
}

std::string ForeignContents(const uint8_t* p, size_t len) {
  for (const Signature& s : kSignatures) {
    if (s.offset + s.len <= len && std::memcmp(p + s.offset, s.bytes, s.len) == 0) return s.what;
  }
  for (size_t i = 0; i < len; ++i) {
    if (p[i] != 0) return absl::StrCat("data (first non-zero byte at offset ", i, ")");
  }
  return "";
}

absl::StatusOr<RawPool> OpenOrCreateRawPool(io::IoBackend* io,
                                            const std::vector<std::string>& devices,
                                            const PoolLayout& layout,
                                            const std::string& devices_field) {
  const uint32_t n = io->num_files();
  if (layout.num_files() != n || devices.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("raw pool: ", n, " namespaces, ",
                                                   devices.size(), " names, a layout of ",
                                                   layout.num_files(), " files"));
  }
  std::vector<Found> found;
  std::vector<std::string> fresh, pooled;
  for (uint32_t i = 0; i < n; ++i) {
    if (io->file_size(i) < layout.file_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          devices[i], " holds ", io->file_size(i), " bytes; pool file ", i, " needs ",
          layout.file_bytes(), ": lower pool.capacity_bytes"));
    }
    ASSIGN_OR_RETURN(Found f, Inspect(io, i, devices[i], devices_field));
    (f.fresh ? fresh : pooled).push_back(devices[i]);
    found.push_back(f);
  }
  if (pooled.empty()) return Create(io, devices, layout);
  if (!fresh.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(fresh, ", "), " ", fresh.size() == 1 ? "is" : "are", " fresh while ",
        absl::StrJoin(pooled, ", "), pooled.size() == 1 ? " holds" : " hold",
        " a tutti pool: if a namespace was replaced or added, "
        "or a creation was interrupted, restore ", devices_field, " or erase the first 1 MiB "
        "of every listed namespace to start an empty pool"));
  }
  for (uint32_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(Check(found[i].sb, layout, i, found[0].sb, devices[i], devices_field));
  }
  RawPool pool;
  pool.uuid = found[0].sb.uuid;
  return pool;
}

}  // namespace tutti::pool

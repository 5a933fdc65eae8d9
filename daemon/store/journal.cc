#include "daemon/store/journal.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_system.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "xxhash.h"

namespace tutti::store {
namespace {

// Record types; see JOURNAL.md.
enum RecordType : uint32_t {
  kFileHeader = 1,
  kNamespace = 2,
  kPut = 3,
  kDelete = 4,
  kCheckpointEnd = 5,
  kCheckpointPut = 6,  // a put and its last use (checkpoints of version 2)
  // Namespace ownership (docs/security.md "Namespaces"); numbered apart from the types above so
  // that types added meanwhile by other changes do not collide.
  kOwnedNamespace = 10,
  kNamespaceDrop = 11,
};
enum FileKind : uint32_t { kJournalFile = 0, kCheckpointFile = 1 };

constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'J', 'N', 'L'};
// Journal files are still written as version 1 (nothing in them changed);
// checkpoints as version 2 (their puts are kCheckpointPut). Both are read.
constexpr uint32_t kJournalVersion = 1;
constexpr uint32_t kCheckpointVersion = 2;
constexpr uint32_t kMaxVersion = 2;
constexpr uint32_t kMaxPayload = 16u << 20;  // larger lengths are garbage (a torn record)
constexpr size_t kFraming = 16;              // length, type, checksum
constexpr char kCheckpointName[] = "checkpoint";
constexpr char kCheckpointTmpName[] = "checkpoint.tmp";
constexpr char kJournalPrefix[] = "journal.";
constexpr char kLockName[] = "lock";
constexpr size_t kFlushBytes = 1 << 20;

// --- Encoding ---

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// Appends one framed record whose payload `fill` writes.
template <typename Fill>
void AppendRecord(std::string* out, RecordType type, Fill fill) {
  const size_t start = out->size();
  PutU32(out, 0);  // length, patched below
  PutU32(out, type);
  fill(out);
  const uint32_t len = static_cast<uint32_t>(out->size() - start - 8);
  for (int i = 0; i < 4; ++i) (*out)[start + i] = static_cast<char>(len >> (8 * i));
  PutU64(out, XXH3_64bits(out->data() + start + 4, 4 + len));
}

void EncodeHeader(std::string* out, FileKind kind, uint64_t gen) {
  AppendRecord(out, kFileHeader, [&](std::string* p) {
    p->append(kMagic, 8);
    PutU32(p, kind == kCheckpointFile ? kCheckpointVersion : kJournalVersion);
    PutU32(p, kind);
    PutU64(p, gen);
  });
}

// Always the owned form (type 10); type 2 is only read.
void Encode(std::string* out, const NamespaceRecord& r) {
  AppendRecord(out, kOwnedNamespace, [&](std::string* p) {
    PutU64(p, r.ns);
    PutU32(p, r.owner_uid);
    PutU32(p, r.shared ? 1 : 0);
    PutU32(p, static_cast<uint32_t>(r.scope.size()));
    p->append(r.scope);
    p->append(r.descriptor);
  });
}

void Encode(std::string* out, const NamespaceDropRecord& r) {
  AppendRecord(out, kNamespaceDrop, [&](std::string* p) { PutU64(p, r.ns); });
}

// A put as the journal keeps it (kPut), or as a checkpoint does (kCheckpointPut:
// the same payload, then the last use).
void Encode(std::string* out, const PutRecord& r, RecordType type = kPut) {
  AppendRecord(out, type, [&](std::string* p) {
    PutU64(p, r.ns);
    p->append(r.key.view());
    PutU64(p, r.slot);
    PutU64(p, r.epoch);
    PutU32(p, r.object_len);
    PutU32(p, static_cast<uint32_t>(r.checksums.size()));
    for (uint64_t c : r.checksums) PutU64(p, c);
    if (type == kCheckpointPut) PutU64(p, r.last_use);
  });
}

void Encode(std::string* out, const DeleteRecord& r) {
  AppendRecord(out, kDelete, [&](std::string* p) {
    PutU64(p, r.ns);
    p->append(r.key.view());
    PutU64(p, r.slot);
    PutU64(p, r.epoch);
  });
}

// --- Decoding ---

// Reads little-endian fields from a payload; `ok()` turns false on any overrun.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view p) : p_(p) {}
  uint32_t U32() { return static_cast<uint32_t>(Uint(4)); }
  uint64_t U64() { return Uint(8); }
  std::string_view Bytes(size_t n) {
    if (n > p_.size()) return Fail();
    std::string_view v = p_.substr(0, n);
    p_.remove_prefix(n);
    return v;
  }
  std::string_view Rest() { return Bytes(p_.size()); }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && p_.empty(); }

 private:
  uint64_t Uint(size_t n) {
    std::string_view b = Bytes(n);
    uint64_t v = 0;
    for (size_t i = b.size(); i > 0; --i) v = v << 8 | static_cast<uint8_t>(b[i - 1]);
    return v;
  }
  std::string_view Fail() {
    ok_ = false;
    p_ = {};
    return {};
  }
  std::string_view p_;
  bool ok_ = true;
};

bool DecodeKey(PayloadReader& in, Key* key) { return Key::FromBytes(in.Bytes(Key::kSize), key); }

// Type 2: written before namespaces had owners; shared by every user.
bool DecodeLegacy(std::string_view payload, NamespaceRecord* r) {
  PayloadReader in(payload);
  r->ns = in.U64();
  r->descriptor = std::string(in.Rest());
  r->scope.clear();
  r->owner_uid = 0;
  r->shared = true;
  return in.ok();
}

bool Decode(std::string_view payload, NamespaceRecord* r) {
  PayloadReader in(payload);
  r->ns = in.U64();
  r->owner_uid = in.U32();
  const uint32_t flags = in.U32();
  const uint32_t scope_len = in.U32();
  if (!in.ok() || flags > 1) return false;
  r->shared = flags == 1;
  r->scope = std::string(in.Bytes(scope_len));
  r->descriptor = std::string(in.Rest());
  return in.ok();
}

bool Decode(std::string_view payload, NamespaceDropRecord* r) {
  PayloadReader in(payload);
  r->ns = in.U64();
  return in.done();
}

// A kPut or kCheckpointPut payload (`type`).
bool Decode(std::string_view payload, uint32_t type, PutRecord* r) {
  PayloadReader in(payload);
  r->ns = in.U64();
  if (!DecodeKey(in, &r->key)) return false;
  r->slot = in.U64();
  r->epoch = in.U64();
  r->object_len = in.U32();
  const uint32_t count = in.U32();
  if (!in.ok() || count > payload.size() / 8) return false;
  r->checksums.resize(count);
  for (uint64_t& c : r->checksums) c = in.U64();
  r->last_use = type == kCheckpointPut ? in.U64() : 0;
  return in.done();
}

bool Decode(std::string_view payload, DeleteRecord* r) {
  PayloadReader in(payload);
  r->ns = in.U64();
  if (!DecodeKey(in, &r->key)) return false;
  r->slot = in.U64();
  r->epoch = in.U64();
  return in.done();
}

struct FileHeader {
  FileKind kind;
  uint64_t gen;
};

bool Decode(std::string_view payload, FileHeader* h) {
  PayloadReader in(payload);
  if (in.Bytes(8) != std::string_view(kMagic, 8)) return false;
  const uint32_t version = in.U32();
  if (version < 1 || version > kMaxVersion) return false;
  h->kind = static_cast<FileKind>(in.U32());
  h->gen = in.U64();
  return in.done();
}

// --- Files ---

std::string JournalPath(const std::string& dir, uint64_t gen) {
  return absl::StrCat(dir, "/", kJournalPrefix, gen);
}

// The generations of the journal files in `dir`, ascending.
absl::StatusOr<std::vector<uint64_t>> ListGenerations(FileSystem& fs, const std::string& dir) {
  ASSIGN_OR_RETURN(const std::vector<std::string> names, fs.ListDir(dir));
  std::vector<uint64_t> gens;
  for (const std::string& entry : names) {
    std::string_view name = entry;
    if (name.substr(0, sizeof(kJournalPrefix) - 1) != kJournalPrefix) continue;
    name.remove_prefix(sizeof(kJournalPrefix) - 1);
    uint64_t gen;
    const bool digits = !name.empty() && std::all_of(name.begin(), name.end(), ::isdigit);
    if (digits && absl::SimpleAtoi(absl::string_view(name.data(), name.size()), &gen)) {
      gens.push_back(gen);
    }
  }
  std::sort(gens.begin(), gens.end());
  return gens;
}

// Streams framed records out of a file.
class RecordReader {
 public:
  enum Result { kRecord, kEnd, kTorn, kError };
  explicit RecordReader(std::unique_ptr<SequentialFile> file) : file_(std::move(file)) {}

  // On kRecord, *type and *payload (valid until the next call) hold the record.
  // kEnd: clean end of file. kTorn: a partial or corrupt record (nothing after
  // it is read). kError: see status().
  Result Next(uint32_t* type, std::string_view* payload) {
    if (!Fill(8)) return Available() == 0 && status_.ok() ? kEnd : Fail();
    const uint32_t len = Le32(buf_.data() + pos_);
    if (len > kMaxPayload || !Fill(kFraming + len)) return Fail();
    const char* rec = buf_.data() + pos_;
    uint64_t sum = 0;
    for (int i = 7; i >= 0; --i) sum = sum << 8 | static_cast<uint8_t>(rec[8 + len + i]);
    if (sum != XXH3_64bits(rec + 4, 4 + len)) return Fail();
    *type = Le32(rec + 4);
    *payload = std::string_view(rec + 8, len);
    pos_ += kFraming + len;
    good_bytes_ += kFraming + len;
    return kRecord;
  }
  const absl::Status& status() const { return status_; }
  // Bytes of whole, verified records returned so far.
  uint64_t good_bytes() const { return good_bytes_; }

 private:
  static uint32_t Le32(const char* p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(p[i]);
    return v;
  }
  size_t Available() const { return buf_.size() - pos_; }
  Result Fail() { return status_.ok() ? kTorn : kError; }

  // Makes `need` bytes available at pos_; false at end of file (or on a read
  // error).
  bool Fill(size_t need) {
    if (Available() >= need) return true;
    buf_.erase(0, pos_);
    pos_ = 0;
    while (buf_.size() < need && !eof_) {
      const size_t old = buf_.size();
      buf_.resize(std::max(need, old + kFlushBytes));
      const absl::StatusOr<size_t> n = file_->Read(&buf_[old], buf_.size() - old);
      if (!n.ok()) status_ = n.status();
      eof_ = !n.ok() || *n == 0;
      buf_.resize(old + (n.ok() ? *n : 0));
    }
    return buf_.size() >= need;
  }

  const std::unique_ptr<SequentialFile> file_;
  std::string buf_;
  size_t pos_ = 0;
  uint64_t good_bytes_ = 0;
  bool eof_ = false;
  absl::Status status_;
};

// Writes records into a file through a buffer, flushing as it grows.
class BufferedFile {
 public:
  explicit BufferedFile(std::unique_ptr<WritableFile> file) : file_(std::move(file)) {}
  std::string* buffer() { return &buf_; }
  absl::Status MaybeFlush() { return buf_.size() >= kFlushBytes ? Flush() : absl::OkStatus(); }
  absl::Status Flush() {
    RETURN_IF_ERROR(file_->Append(buf_));
    buf_.clear();
    return absl::OkStatus();
  }
  absl::Status FlushAndSync() {
    RETURN_IF_ERROR(Flush());
    return file_->Sync();
  }

 private:
  std::unique_ptr<WritableFile> file_;
  std::string buf_;
};

// Writes the checkpoint's records as `snapshot` emits them.
class CheckpointWriter : public Journal::Emitter {
 public:
  explicit CheckpointWriter(BufferedFile* file) : file_(file) {}
  void Emit(const NamespaceRecord& r) override {
    Add([&](std::string* b) { Encode(b, r); });
  }
  void Emit(const PutRecord& r) override {
    Add([&](std::string* b) { Encode(b, r, kCheckpointPut); });
  }
  uint64_t records() const { return records_; }
  const absl::Status& status() const { return status_; }

 private:
  template <typename F>
  void Add(F encode) {
    if (!status_.ok()) return;
    encode(file_->buffer());
    ++records_;
    status_ = file_->MaybeFlush();
  }
  BufferedFile* file_;
  uint64_t records_ = 0;
  absl::Status status_;
};

// Records decoded during one recovery, reused from record to record so replay
// allocates nothing per record (a Put's checksums keep their capacity).
struct DecodeScratch {
  NamespaceRecord ns;
  NamespaceDropRecord drop;
  PutRecord put;
  DeleteRecord del;
};

// Delivers one record to the visitor. False if the payload does not parse.
bool Deliver(uint32_t type, std::string_view payload, const RecoveryVisitor& v,
             DecodeScratch* scratch) {
  switch (type) {
    case kNamespace:
      if (!DecodeLegacy(payload, &scratch->ns)) return false;
      if (v.on_namespace) v.on_namespace(scratch->ns);
      return true;
    case kOwnedNamespace:
      if (!Decode(payload, &scratch->ns)) return false;
      if (v.on_namespace) v.on_namespace(scratch->ns);
      return true;
    case kNamespaceDrop:
      if (!Decode(payload, &scratch->drop)) return false;
      if (v.on_namespace_drop) v.on_namespace_drop(scratch->drop);
      return true;
    case kPut:
    case kCheckpointPut:
      if (!Decode(payload, type, &scratch->put)) return false;
      if (v.on_put) v.on_put(scratch->put);
      return true;
    case kDelete:
      if (!Decode(payload, &scratch->del)) return false;
      if (v.on_delete) v.on_delete(scratch->del);
      return true;
    default:
      return false;
  }
}

// Loads the checkpoint: its generation, records delivered to `v`. Any flaw is
// DATA_LOSS.
absl::StatusOr<uint64_t> LoadCheckpoint(FileSystem& fs, const std::string& path,
                                        const RecoveryVisitor& v, RecoveryReport* report) {
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, fs.OpenForRead(path));
  RecordReader reader(std::move(file));
  auto corrupt = [&](const std::string& what) {
    if (!reader.status().ok()) return reader.status();
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " is corrupt (", what,
                     "); refusing to start from a wrong index. "
                     "Restore it from a backup, or move the state directory's "
                     "journal files and checkpoint "
                     "away together with the pool files to start empty"));
  };
  uint32_t type;
  std::string_view payload;
  FileHeader header;
  if (reader.Next(&type, &payload) != RecordReader::kRecord || type != kFileHeader ||
      !Decode(payload, &header) || header.kind != kCheckpointFile) {
    return corrupt("bad file header");
  }
  uint64_t records = 0;
  DecodeScratch scratch;
  for (;;) {
    const RecordReader::Result r = reader.Next(&type, &payload);
    if (r != RecordReader::kRecord) return corrupt("ends without its end record");
    if (type == kCheckpointEnd) break;
    if (!Deliver(type, payload, v, &scratch)) {
      return corrupt(absl::StrCat("bad record of type ", type));
    }
    ++records;
  }
  PayloadReader end(payload);
  if (end.U64() != records || !end.done()) return corrupt("record count mismatch");
  if (reader.Next(&type, &payload) != RecordReader::kEnd) return corrupt("data after the end");
  report->records += records;
  return header.gen;
}

// Replays one journal file up to its first torn or corrupt record.
absl::Status ReplayJournal(FileSystem& fs, const std::string& path, uint64_t gen,
                           const RecoveryVisitor& v, RecoveryReport* report) {
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, fs.OpenForRead(path));
  RecordReader reader(std::move(file));
  uint32_t type;
  std::string_view payload;
  RecordReader::Result r = reader.Next(&type, &payload);
  FileHeader header;
  if (r == RecordReader::kRecord) {
    if (type != kFileHeader || !Decode(payload, &header) || header.kind != kJournalFile ||
        header.gen != gen) {
      return absl::DataLossError(absl::StrCat(path,
                                              " does not start with its own journal "
                                              "header (a file renamed or copied in?)"));
    }
    DecodeScratch scratch;
    while ((r = reader.Next(&type, &payload)) == RecordReader::kRecord) {
      if (!Deliver(type, payload, v, &scratch)) {
        r = RecordReader::kTorn;  // well-framed but unreadable: treat as the end
                                  // of this file
        break;
      }
      ++report->records;
    }
  }
  if (r == RecordReader::kError) return reader.status();
  if (r == RecordReader::kTorn) {
    ++report->torn_tails;
    log::Get("journal")->warn(
        "{}: torn or corrupt record at byte {}; the rest "
        "of this file is ignored (a crash "
        "mid-append)",
        path, reader.good_bytes());
  }
  return absl::OkStatus();
}

// Removes journal files older than the checkpoint's generation `base` and
// checks that the others run without a gap from `base` (from 1 without a
// checkpoint). Leaves those in `*gens`.
absl::Status CheckGenerations(FileSystem& fs, const std::string& dir, uint64_t base,
                              std::vector<uint64_t>* gens) {
  std::vector<uint64_t> keep;
  for (uint64_t gen : *gens) {
    if (gen >= base) {
      keep.push_back(gen);
    } else if (fs.Unlink(JournalPath(dir, gen)).ok()) {
      log::Get("journal")->info("{}: removed, superseded by the checkpoint", JournalPath(dir, gen));
    }
  }
  const uint64_t first = base == 0 ? 1 : base;
  for (size_t i = 0; i < keep.size() || (i == 0 && base > 0); ++i) {
    if (i < keep.size() && keep[i] == first + i) continue;
    return absl::DataLossError(absl::StrCat(
        JournalPath(dir, first + i), " is missing (", base == 0 ? "no checkpoint" : "checkpoint",
        " generation ", base, ", journal files from ", keep.empty() ? 0 : keep.front(),
        "): committed records are lost; refusing to start from a wrong index. "
        "Move the state "
        "directory's files away together with the pool files to start empty"));
  }
  *gens = std::move(keep);
  return absl::OkStatus();
}

// Creates journal.<gen> holding only its header, durably (file and directory
// entry), and fstats it into `*info`. On any failure the file is removed again, so
// that a retry can create it (O_EXCL).
absl::StatusOr<std::unique_ptr<WritableFile>> CreateGeneration(FileSystem& fs,
                                                               const std::string& dir, uint64_t gen,
                                                               FileInfo* info) {
  const std::string path = JournalPath(dir, gen);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   fs.Create(path, FileSystem::CreateMode::kExclusive));
  std::string header;
  EncodeHeader(&header, kJournalFile, gen);
  absl::Status s = file->Append(header);
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = fs.SyncDir(dir);
  if (s.ok()) {
    absl::StatusOr<FileInfo> st = file->Stat();
    if (st.ok()) *info = *st;
    s = st.status();
  }
  if (!s.ok()) {
    file.reset();
    (void)fs.Unlink(path);
    return s;
  }
  return file;
}

// Takes the state directory's lock: flock(LOCK_EX | LOCK_NB) on "lock", whose
// content is the holder's pid.
absl::StatusOr<std::unique_ptr<FileLock>> TakeStateLock(FileSystem& fs, const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kLockName);
  absl::StatusOr<std::unique_ptr<FileLock>> lock = fs.Lock(path, absl::StrCat(getpid(), "\n"));
  if (lock.ok() || ErrnoOf(lock.status()) != EWOULDBLOCK) return lock;
  std::string holder = ReadFileToString(fs, path).value_or("").substr(0, 31);
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return absl::FailedPreconditionError(absl::StrCat(
      "state dir ", dir, " is in use by another process (pid ", holder.empty() ? "unknown" : holder,
      " holds ", path,
      "): two daemons on one state directory would overwrite each other's journal; stop the "
      "other one or give this one its own state_dir"));
}

// Writes checkpoint.tmp (header, the snapshot's records, end record), syncs it
// and renames it to "checkpoint", then syncs the directory.
absl::Status WriteCheckpoint(FileSystem& fs, const std::string& dir, uint64_t gen,
                             const std::function<void(Journal::Emitter&)>& snapshot) {
  const std::string tmp = absl::StrCat(dir, "/", kCheckpointTmpName);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out,
                   fs.Create(tmp, FileSystem::CreateMode::kTruncate));
  absl::Status s;
  {
    BufferedFile file(std::move(out));
    EncodeHeader(file.buffer(), kCheckpointFile, gen);
    CheckpointWriter writer(&file);
    snapshot(writer);
    s = writer.status();
    if (s.ok()) {
      AppendRecord(file.buffer(), kCheckpointEnd,
                   [&](std::string* p) { PutU64(p, writer.records()); });
      s = file.FlushAndSync();
    }
  }
  const std::string ckpt = absl::StrCat(dir, "/", kCheckpointName);
  if (s.ok()) s = fs.Rename(tmp, ckpt);
  if (s.ok()) s = fs.SyncDir(dir);
  if (!s.ok()) (void)fs.Unlink(tmp);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& state_dir,
                                                       const RecoveryVisitor& visitor,
                                                       RecoveryReport* report, FileSystem* fs) {
  RecoveryReport local;
  if (report == nullptr) report = &local;
  *report = RecoveryReport{};
  const absl::StatusOr<FileInfo> dir = fs->Stat(state_dir);
  if (!dir.ok() || !dir->is_dir) {
    return absl::FailedPreconditionError(
        absl::StrCat("state dir ", state_dir, " does not exist or is not a directory"));
  }
  std::unique_ptr<Journal> j(new Journal(fs));
  j->state_dir_ = state_dir;
  j->dir_dev_ = dir->dev;
  j->dir_ino_ = dir->ino;
  ASSIGN_OR_RETURN(j->lock_, TakeStateLock(*fs, state_dir));  // before anything is read

  // An unfinished checkpoint; absent as a rule.
  (void)fs->Unlink(absl::StrCat(state_dir, "/", kCheckpointTmpName));
  ASSIGN_OR_RETURN(std::vector<uint64_t> gens, ListGenerations(*fs, state_dir));
  uint64_t base = 0;  // generation of the checkpoint; 0 without one
  const std::string ckpt = absl::StrCat(state_dir, "/", kCheckpointName);
  const absl::StatusOr<FileInfo> ckpt_info = fs->Stat(ckpt);
  if (ckpt_info.ok()) {
    ASSIGN_OR_RETURN(base, LoadCheckpoint(*fs, ckpt, visitor, report));
  } else if (ErrnoOf(ckpt_info.status()) != ENOENT) {
    return ckpt_info.status();  // not known to be absent: never recover without it
  }
  RETURN_IF_ERROR(CheckGenerations(*fs, state_dir, base, &gens));
  for (uint64_t gen : gens) {
    RETURN_IF_ERROR(ReplayJournal(*fs, JournalPath(state_dir, gen), gen, visitor, report));
  }
  const uint64_t next = std::max(base, gens.empty() ? 0 : gens.back()) + 1;
  {
    absl::MutexLock lock(&j->sync_mu_);
    RETURN_IF_ERROR(j->StartGeneration(next));
  }
  report->generation = next;
  log::Get("journal")->info(
      "{}: recovered {} records (checkpoint generation {}, {} journal files, {} torn tails); "
      "appending to generation {}",
      state_dir, report->records, base, gens.size(), report->torn_tails, next);
  return j;
}

Journal::~Journal() {
  absl::MutexLock lock(&sync_mu_);
  file_.reset();
  lock_.reset();  // releases the state directory's lock
}

absl::Status Journal::StartGeneration(uint64_t gen) {
  FileInfo st;
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   CreateGeneration(*fs_, state_dir_, gen, &st));
  file_ = std::move(file);
  file_dev_ = st.dev;
  file_ino_ = st.ino;
  generation_ = gen;
  return absl::OkStatus();
}

uint64_t Journal::Append(const PutRecord& r) {
  absl::MutexLock lock(&append_mu_);
  Encode(&buffer_, r);
  ++records_since_checkpoint_;
  return ++appended_seq_;
}

uint64_t Journal::Append(const DeleteRecord& r) {
  absl::MutexLock lock(&append_mu_);
  Encode(&buffer_, r);
  ++records_since_checkpoint_;
  return ++appended_seq_;
}

uint64_t Journal::Append(const NamespaceRecord& r) {
  absl::MutexLock lock(&append_mu_);
  Encode(&buffer_, r);
  ++records_since_checkpoint_;
  return ++appended_seq_;
}

uint64_t Journal::Append(const NamespaceDropRecord& r) {
  absl::MutexLock lock(&append_mu_);
  Encode(&buffer_, r);
  ++records_since_checkpoint_;
  return ++appended_seq_;
}

uint64_t Journal::records_since_checkpoint() const {
  absl::MutexLock lock(&append_mu_);
  return records_since_checkpoint_;
}

absl::Status Journal::durability() const {
  absl::MutexLock lock(&append_mu_);
  return durability_;
}

absl::Status Journal::CheckInPlace() {
  std::string why;
  const absl::StatusOr<FileInfo> dir = fs_->Stat(state_dir_);
  if (!dir.ok()) {
    why = absl::StrCat("state dir ", state_dir_,
                       " is gone (stat: ", std::strerror(ErrnoOf(dir.status())), ")");
  } else if (dir->dev != dir_dev_ || dir->ino != dir_ino_) {
    why = absl::StrCat("state dir ", state_dir_, " was replaced by another directory");
  } else if (file_ != nullptr) {
    const std::string path = JournalPath(state_dir_, generation_);
    const absl::StatusOr<FileInfo> open = file_->Stat();
    absl::StatusOr<FileInfo> named;
    if (!open.ok()) {
      why = std::string(open.status().message());
    } else if (open->nlink == 0) {
      why = absl::StrCat("journal file ", path, " was deleted");
    } else if (named = fs_->Stat(path);
               !named.ok() || named->dev != file_dev_ || named->ino != file_ino_) {
      why = absl::StrCat("journal file ", path, " was moved or replaced");
    }
  }
  if (why.empty()) return absl::OkStatus();
  absl::MutexLock lock(&append_mu_);
  if (durability_.ok()) {
    durability_ = absl::FailedPreconditionError(absl::StrCat(
        why,
        " while the daemon runs: the journal is no longer where a restart reads it, so "
        "nothing stored from now on is durable and blocks stored before may be gone; restart "
        "the daemon on an intact state directory"));
    log::Get("journal")->critical("DURABILITY LOST: {}", std::string(durability_.message()));
  }
  return durability_;
}

absl::Status Journal::WriteAndSync(const std::string& data) {
  if (data.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckInPlace());
  // After a failure closed the file, appends continue in a fresh generation.
  if (file_ == nullptr) RETURN_IF_ERROR(StartGeneration(generation_ + 1));
  const std::string path = JournalPath(state_dir_, generation_);
  absl::Status s = file_->Append(data);
  if (s.ok()) s = file_->Sync();
  if (s.ok()) return CheckInPlace();
  // The file may now end in a partial record, and after a failed fdatasync the
  // kernel may have dropped the dirty pages: never append to it again. The
  // caller does not publish the records; the next write starts a new
  // generation, which recovery reads after this one.
  log::Get("journal")->error("{}: {}; abandoning this journal file", path, s.ToString());
  file_.reset();
  return s;
}

absl::Status Journal::SyncBuffer() {
  std::string data;
  uint64_t last;
  {
    absl::MutexLock lock(&append_mu_);
    data.swap(buffer_);
    last = appended_seq_;
  }
  const uint64_t after = taken_seq_;
  taken_seq_ = last;
  absl::Status s = WriteAndSync(data);
  if (s.ok()) {
    durable_seq_ = last;
    return s;
  }
  if (lost_.size() == kMaxLostRanges) lost_.erase(lost_.begin());
  lost_.push_back(LostRange{after, last, s});
  return s;
}

absl::Status Journal::Sync(uint64_t seq) {
  absl::MutexLock lock(&sync_mu_);
  for (const LostRange& r : lost_) {
    if (seq > r.after && seq <= r.last) return r.status;
  }
  if (seq <= durable_seq_) return absl::OkStatus();
  return SyncBuffer();
}

absl::Status Journal::Sync() {
  uint64_t seq;
  {
    absl::MutexLock lock(&append_mu_);
    seq = appended_seq_;
  }
  return Sync(seq);
}

absl::Status Journal::Checkpoint(const std::function<void(Journal::Emitter&)>& snapshot) {
  absl::MutexLock lock(&sync_mu_);
  RETURN_IF_ERROR(SyncBuffer());
  RETURN_IF_ERROR(CheckInPlace());
  // 1. A new, durable, empty generation: from now on recovery needs the
  //    checkpoint that follows, or, if we crash before its rename, the old
  //    checkpoint plus every journal file. After a failed attempt the
  //    generation it started is used again: its records replay over a later
  //    snapshot just as over one taken at its start.
  if (rotate_) {
    RETURN_IF_ERROR(StartGeneration(generation_ + 1));
    rotate_ = false;
  }
  uint64_t counted;
  {
    absl::MutexLock alock(&append_mu_);
    counted = records_since_checkpoint_;
  }
  // 2. The snapshot, written aside and renamed into place.
  RETURN_IF_ERROR(WriteCheckpoint(*fs_, state_dir_, generation_, snapshot));
  rotate_ = true;
  {
    absl::MutexLock alock(&append_mu_);
    records_since_checkpoint_ -= counted;  // those appended meanwhile are in the new generation
  }
  // 3. Older generations are now redundant.
  auto gens = ListGenerations(*fs_, state_dir_);
  if (!gens.ok()) return absl::OkStatus();  // removed at the next Open instead
  for (uint64_t gen : *gens) {
    if (gen < generation_) (void)fs_->Unlink(JournalPath(state_dir_, gen));
  }
  return absl::OkStatus();
}

}  // namespace tutti::store

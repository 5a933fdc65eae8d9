#include "daemon/service/reload.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"

namespace tutti::service {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

bool IsRunTime(std::string_view path) {
  return std::find(std::begin(kRunTimeFields), std::end(kRunTimeFields), path) !=
         std::end(kRunTimeFields);
}

std::string ValueText(const Message& m, const FieldDescriptor* f) {
  std::string text;
  google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &text);
  return text;
}

bool SameField(const Message& a, const Message& b, const FieldDescriptor* f) {
  if (f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    google::protobuf::util::MessageDifferencer d;
    d.set_scope(google::protobuf::util::MessageDifferencer::FULL);
    return d.CompareWithFields(a, b, {f}, {f});
  }
  return ValueText(a, f) == ValueText(b, f);
}

// Copies the scalar field `f` of `from` into `to` (messages of one type). False for a type no
// run-time field has.
bool CopyScalar(const Message& from, const FieldDescriptor* f, Message* to) {
  const Reflection* in = from.GetReflection();
  const Reflection* out = to->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      out->SetString(to, f, in->GetString(from, f));
      return true;
    case FieldDescriptor::CPPTYPE_UINT64:
      out->SetUInt64(to, f, in->GetUInt64(from, f));
      return true;
    case FieldDescriptor::CPPTYPE_UINT32:
      out->SetUInt32(to, f, in->GetUInt32(from, f));
      return true;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out->SetDouble(to, f, in->GetDouble(from, f));
      return true;
    default:
      return false;
  }
}

// Appends to `plan` each changed field of `loaded` against `running` (messages of one type, both
// `out`'s or its sub-message's at `prefix`), copying the run-time ones into `out` (reached through
// `mutable_out`, so that no empty sub-message is made where nothing is copied).
void Diff(const Message& running, const Message& loaded, const std::string& prefix,
          const std::function<Message*()>& mutable_out, ReloadPlan* plan) {
  const google::protobuf::Descriptor* desc = running.GetDescriptor();
  const Reflection* refl = running.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    const std::string path = prefix + f->name();
    if (SameField(running, loaded, f)) continue;
    if (!f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Diff(refl->GetMessage(running, f), refl->GetMessage(loaded, f), path + ".",
           [&mutable_out, f] {
             Message* m = mutable_out();
             return m->GetReflection()->MutableMessage(m, f);
           },
           plan);
      continue;
    }
    if (IsRunTime(path) && CopyScalar(loaded, f, mutable_out())) {
      plan->applied.push_back(
          absl::StrCat(path, ": ", ValueText(running, f), " -> ", ValueText(loaded, f)));
    } else {
      plan->refused.push_back(path);
    }
  }
}

}  // namespace

ReloadPlan PlanReload(const tutti::v1::Config& running, const tutti::v1::Config& loaded) {
  ReloadPlan plan;
  plan.config = running;
  Diff(running, loaded, "", [&plan]() -> Message* { return &plan.config; }, &plan);
  return plan;
}

tutti::v1::Config Reload(const tutti::v1::Config& running,
                         const absl::StatusOr<tutti::v1::Config>& loaded, const std::string& unit,
                         store::BlockStore* store) {
  auto log = log::Get("main");
  if (!loaded.ok()) {
    log->error("reload refused: {}; the running configuration stays in force",
               std::string(loaded.status().message()));
    return running;
  }
  ReloadPlan plan = PlanReload(running, *loaded);
  for (const std::string& field : plan.refused) {
    log->warn("reload: {} changed: it takes effect only at start; restart {}", field, unit);
  }
  const v1::DatapathConfig& dp = plan.config.datapath();
  if (const absl::Status set = store->SetWriteBacklogBounds(dp.max_write_backlog_bytes(),
                                                            dp.max_write_backlog_age_ms());
      !set.ok()) {
    // Validation admits no such value; kept for safety: nothing of this reload applies.
    log->error("reload refused: datapath: {}; the running configuration stays in force",
               std::string(set.message()));
    return running;
  }
  // Logged before the level changes, so that a move to "warn" is still seen.
  for (const std::string& change : plan.applied) log->info("reload: {}", change);
  if (plan.applied.empty() && plan.refused.empty()) log->info("reload: nothing changed");
  log::SetLevel(plan.config.log_level());
  return plan.config;
}

}  // namespace tutti::service

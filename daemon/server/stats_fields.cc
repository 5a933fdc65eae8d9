#include "daemon/server/stats_fields.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tutti::server {
namespace {

using google::protobuf::FieldDescriptor;

// A field that can carry a figure: one number or a bool.
const FieldDescriptor* FigureField(const google::protobuf::Descriptor& d, const std::string& name) {
  const FieldDescriptor* f = d.FindFieldByName(name);
  if (f == nullptr || f->is_repeated()) return nullptr;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_BOOL:
      return f;
    default:
      return nullptr;
  }
}

void Set(google::protobuf::Message* msg, const std::string& name, double v) {
  const FieldDescriptor* f = FigureField(*msg->GetDescriptor(), name);
  if (f == nullptr) return;
  const google::protobuf::Reflection* r = msg->GetReflection();
  const double whole = std::round(v);
  const double unsigned_whole = std::max(0.0, whole);
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(msg, f, static_cast<int32_t>(whole));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(msg, f, static_cast<int64_t>(whole));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(msg, f, static_cast<uint32_t>(unsigned_whole));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(msg, f, static_cast<uint64_t>(unsigned_whole));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(msg, f, v);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(msg, f, static_cast<float>(v));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(msg, f, v != 0);
      break;
    default:
      break;
  }
}

const char* TypeName(stats::Type t) {
  switch (t) {
    case stats::Type::kCounter:
      return "counter";
    case stats::Type::kHistogram:
      return "histogram";
    case stats::Type::kGauge:
      break;
  }
  return "gauge";
}

}  // namespace

void SetNamedFields(const std::vector<stats::Family>& families, google::protobuf::Message* msg) {
  for (const stats::Family& f : families) {
    double sum = 0;
    for (const stats::Sample& s : f.samples) {
      sum += s.value;
      if (!s.field.empty()) Set(msg, s.field, s.value);
    }
    if (!f.spec.field.empty()) Set(msg, f.spec.field, sum * f.spec.field_scale);
  }
}

std::vector<std::string> UnknownFields(const std::vector<stats::Family>& families,
                                       const google::protobuf::Descriptor& msg) {
  std::vector<std::string> unknown;
  auto check = [&](const std::string& name) {
    if (!name.empty() && FigureField(msg, name) == nullptr) unknown.push_back(name);
  };
  for (const stats::Family& f : families) {
    check(f.spec.field);
    for (const stats::Sample& s : f.samples) check(s.field);
  }
  return unknown;
}

void AddMetricFamilies(const std::vector<stats::Family>& families,
                       google::protobuf::RepeatedPtrField<tutti::v1::MetricFamily>* out) {
  for (const stats::Family& f : families) {
    tutti::v1::MetricFamily* m = out->Add();
    m->set_name(f.spec.name);
    m->set_help(f.spec.help);
    m->set_type(TypeName(f.spec.type));
    m->set_unit(stats::UnitOf(f.spec.name));
    for (const std::string& l : f.spec.labels) m->add_label_names(l);
    for (const stats::Sample& s : f.samples) {
      tutti::v1::MetricSample* row = m->add_samples();
      for (const std::string& v : s.labels) row->add_label_values(v);
      if (f.spec.type == stats::Type::kHistogram) {
        row->set_value(static_cast<double>(s.histogram.count));
        row->set_sum(s.histogram.sum);
      } else {
        row->set_value(s.value);
      }
    }
  }
}

}  // namespace tutti::server

// The stats registry (common/stats.h) as the operator API reports it: the fields that families
// and samples name (Spec::field, Sample::field) set on a response by name, and every family as a
// tutti.v1.MetricFamily. No figure is mapped here by hand: a registered figure reaches Admin.Stats
// (and tuttictl stats) through these.
#ifndef TUTTI_DAEMON_SERVER_STATS_FIELDS_H_
#define TUTTI_DAEMON_SERVER_STATS_FIELDS_H_

#include <string>
#include <vector>

#include "common/stats.h"
#include "google/protobuf/message.h"
#include "tutti/v1/admin.pb.h"

namespace tutti::server {

// Sets each field of `msg` that a family (the sum of its samples, times field_scale) or a sample
// names: numbers rounded to the field's type (negative as 0 for unsigned ones), bools as value
// != 0. Fields `msg` does not have are skipped (StatusResponse has fewer than StatsResponse).
void SetNamedFields(const std::vector<stats::Family>& families, google::protobuf::Message* msg);

// The fields named in `families` that `msg`'s type does not have, or that are not one number or
// bool: none in a well-formed daemon (tests check it).
std::vector<std::string> UnknownFields(const std::vector<stats::Family>& families,
                                       const google::protobuf::Descriptor& msg);

// Appends every family of `families` to `out`.
void AddMetricFamilies(const std::vector<stats::Family>& families,
                       google::protobuf::RepeatedPtrField<tutti::v1::MetricFamily>* out);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_STATS_FIELDS_H_

#ifndef PSCLUSTER_CLI_VARS_COMMAND_H_
#define PSCLUSTER_CLI_VARS_COMMAND_H_

#include <string>

#include "cli/command_output.h"
#include "cli/live_cluster.h"
#include "cli/psctl_report.pb.h"

namespace pscluster {

// `psctl vars`: every dense variable (shape, dtype, optimizer, bytes including optimizer slots)
// with each partition's rows and the ps task that holds it, every table (dim, rows and bytes
// per ps task, optimizer), and what each ps task holds. Placement comes from the chief (the
// placement the daemons use); bytes and row counts from each ps task's ListShards, which also
// confirms that every partition is where the placement puts it.
//
// A ps task that does not answer leaves its cells empty and makes the status UNAVAILABLE
// naming it; a partition missing from the ps task that should hold it makes it
// FAILED_PRECONDITION. The report is filled either way.
CommandOutput RunVarsCommand(LiveCluster& cluster, OutputFormat format);

// The report behind RunVarsCommand, and the errors met while filling it.
psctl::VarsReport BuildVarsReport(LiveCluster& cluster, absl::Status* status);

// The table form of a VarsReport.
std::string FormatVarsReport(const psctl::VarsReport& report);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_VARS_COMMAND_H_

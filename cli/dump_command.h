#ifndef PSCLUSTER_CLI_DUMP_COMMAND_H_
#define PSCLUSTER_CLI_DUMP_COMMAND_H_

#include <string>

#include "absl/status/status.h"
#include "cli/command_output.h"
#include "cli/psctl_report.pb.h"
#include "cli/variable_source.h"

namespace pscluster {

// `psctl dump VAR --out FILE.npy`: the whole variable (its partitions joined, full shape) as
// a float32 .npy file, from a live cluster or a checkpoint. The status of
// DenseVariableSource::Read (NOT_FOUND naming an unknown variable, ...) or of WriteNpyFile;
// nothing is written on error.
CommandOutput RunDumpCommand(DenseVariableSource& source, const std::string& variable,
                             const std::string& out_path, OutputFormat format);

// Writes every dense variable of `source` into `dir` (created when missing): one .npy per
// variable, full shape, partitions joined, named after the variable ('/' becomes "__", other
// characters outside [A-Za-z0-9._-] become '_', a clash gets "-2", "-3"...), and index.json,
// a JSON object from each variable's name to {"file": "NAME.npy", "shape": [..], "dtype":
// "float32"}. Tables are not exported (their keys cannot be listed on a live cluster) and are
// named in the report's skipped_tables.
//
// A variable that cannot be read is left out of index.json and its error kept; the others
// are still written. Returns the first error (with every error's message); fills `report`
// (may be null) with what was written either way.
absl::Status ExportVariablesToNpy(const std::string& dir, DenseVariableSource& source,
                                  psctl::DumpReport* report);

// `psctl dump --all --out DIR`: ExportVariablesToNpy, reported as text or JSON.
CommandOutput RunExportCommand(DenseVariableSource& source, const std::string& dir,
                               OutputFormat format);

// The table form of a DumpReport.
std::string FormatDumpReport(const psctl::DumpReport& report);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_DUMP_COMMAND_H_

#ifndef PSCLUSTER_CLI_TABLE_H_
#define PSCLUSTER_CLI_TABLE_H_

#include <string>
#include <vector>

namespace pscluster {

// A text table with aligned columns, for psctl's human-readable output. Thread-compatible.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);
  // REQUIRES: row.size() == header.size().
  void AddRow(std::vector<std::string> row);
  // Columns separated by two spaces, each padded to its widest cell; one line per row.
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_TABLE_H_

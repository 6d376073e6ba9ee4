#include "cli/variable_source.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pscluster {

absl::StatusOr<const v1::VariableSpec*> FindDenseVariable(const v1::ModelSpec& model,
                                                          const std::string& variable) {
  std::vector<std::string> names;
  for (const v1::VariableSpec& v : model.variables()) {
    if (v.name() == variable) return &v;
    names.push_back(v.name());
  }
  for (const v1::TableSpec& t : model.tables()) {
    if (t.name() == variable) {
      return absl::InvalidArgumentError(
          absl::StrCat(variable, " is an embedding table; only dense variables can be dumped"));
    }
  }
  return absl::NotFoundError(
      absl::StrCat("unknown variable \"", variable,
                   "\" (variables: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

std::string LiveVariableSource::Describe() const {
  return absl::StrCat("cluster at ", cluster_->chief_address);
}

absl::StatusOr<std::vector<float>> LiveVariableSource::Read(const std::string& variable) {
  PS_RETURN_IF_ERROR(FindDenseVariable(model(), variable).status());
  std::vector<std::vector<float>> values;
  PS_RETURN_IF_ERROR(cluster_->client->Pull({variable}, &values));
  return std::move(values[0]);
}

}  // namespace pscluster

// flatten: an image read as a vector; the same tensor, no work.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "model/layer.h"

namespace pscluster {
namespace {

class FlattenLayer final : public Layer {
 public:
  const char* kind() const override { return "flatten"; }

  absl::Status Plan(const v1::Layer& /*config*/, const std::vector<Dims>& inputs,
                    PlanContext* /*ctx*/, Node* node) const override {
    node->out = {
        1, 1,
        static_cast<int>(std::min<int64_t>(inputs[0].size(), std::numeric_limits<int32_t>::max()))};
    return absl::OkStatus();
  }
  bool aliases_input() const override { return true; }

  void Forward(const StepContext& /*ctx*/, Node& /*node*/) const override {}
  void Backward(const StepContext& /*ctx*/, Node& /*node*/) const override {}
};

}  // namespace

const Layer* FlattenLayerKind() {
  static const FlattenLayer layer;
  return &layer;
}

}  // namespace pscluster

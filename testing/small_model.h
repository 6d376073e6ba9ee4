#ifndef PSCLUSTER_TESTING_SMALL_MODEL_H_
#define PSCLUSTER_TESTING_SMALL_MODEL_H_

namespace pscluster {

// A small model (ModelSpec in text format) for ps tests: a 64x16 dense variable "w", a
// 16-element "b", both SGD, and an 8-float Adagrad table "emb". The PsTransport conformance
// suite and the multi-process ps tests use it.
inline constexpr char kSmallModelText[] = R"pb(
  variables {
    name: "w"
    shape { dims: 64 dims: 16 }
    initializer { kind: NORMAL stddev: 0.1 seed: 3 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  variables {
    name: "b"
    shape { dims: 16 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    name: "emb"
    dim: 8
    initializer { kind: UNIFORM min: -0.5 max: 0.5 seed: 9 }
    optimizer { adagrad { learning_rate: 0.1 } }
  }
)pb";

}  // namespace pscluster

#endif  // PSCLUSTER_TESTING_SMALL_MODEL_H_

#include "cli/watch_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pscluster {

std::string FormatProgress(const v1::ClusterStatus& status) {
  const v1::TrainingProgress& p = status.progress();
  std::string test = p.test_accuracy() >= 0 ? absl::StrFormat("test acc %.4f", p.test_accuracy())
                                            : std::string("test acc -");
  if (p.test_auc() >= 0) absl::StrAppend(&test, absl::StrFormat(" auc %.4f", p.test_auc()));
  if (p.test_step() > 0) absl::StrAppend(&test, absl::StrFormat(" (step %d)", p.test_step()));
  return absl::StrFormat("[%6.1fs] step %6d  epoch %2d/%-2d  %8.0f ex/s  loss %.4f  %s",
                         p.elapsed_seconds(), p.global_step(), p.epoch() + 1, p.epochs(),
                         p.examples_per_second(), p.loss(), test);
}

absl::Status RunWatchCommand(ChiefClient& chief, absl::Duration interval,
                             absl::Duration give_up_after, std::ostream& out) {
  absl::Time last_ok = absl::Now();
  std::string last_state;
  while (true) {
    v1::ClusterStatus status;
    absl::Status s = chief.GetClusterStatus(&status);
    if (!s.ok()) {
      if (absl::Now() - last_ok > give_up_after) return absl::UnavailableError(s.message());
    } else {
      last_ok = absl::Now();
      if (status.state() != last_state) {
        out << "chief: " << status.state() << std::endl;
        last_state = status.state();
      }
      if (status.progress().global_step() > 0 || status.progress().finished()) {
        out << FormatProgress(status) << std::endl;
      }
      if (status.progress().finished()) {
        out << absl::StrFormat("final test accuracy: %.4f", status.progress().test_accuracy())
            << std::endl;
        if (status.progress().test_auc() >= 0) {
          out << absl::StrFormat("final test AUC: %.4f", status.progress().test_auc()) << std::endl;
        }
        if (!status.progress().metrics_path().empty()) {
          out << "metrics: " << status.progress().metrics_path() << std::endl;
        }
        return absl::OkStatus();
      }
    }
    absl::SleepFor(interval);
  }
}

}  // namespace pscluster

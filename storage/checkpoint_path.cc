#include "storage/checkpoint_path.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

// The manifest file of a committed checkpoint (storage/checkpoint.cc writes it last).
constexpr char kManifestFile[] = "MANIFEST.json";

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", path, ": ", strerror(errno)));
  }
  return std::string(resolved);
}

}  // namespace

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& checkpoint_dir,
                                              const std::string& name) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint \"", name, "\": ", why,
        "; expected a checkpoint name (e.g. ckpt-0000000120), resolved under this task's "
        "--checkpoint_dir"));
  };
  if (name.empty()) return bad("no checkpoint named");
  if (name.size() > 255) return bad("name too long");
  if (name == "." || name == "..") return bad("not a name");
  for (char c : name) {
    if (c == '/') return bad("a path, not a name");
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) return bad("unprintable character");
  }
  const std::string path = absl::StrCat(checkpoint_dir, "/", name);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return path;  // not there yet: it will be created here
  absl::StatusOr<std::string> dir = RealPath(checkpoint_dir);
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::string> real = RealPath(path);
  if (!real.ok()) return bad("a link that leads nowhere");
  if (!absl::StartsWith(*real, *dir + "/")) {
    return bad(absl::StrCat("leads outside the checkpoint directory (to ", *real, ")"));
  }
  return path;
}

absl::Status CheckNotCommitted(const std::string& path) {
  struct stat st;
  if (stat(absl::StrCat(path, "/", kManifestFile).c_str(), &st) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path, " is committed; a committed checkpoint is never written into again"));
  }
  return absl::OkStatus();
}

absl::Status CheckShardFileName(const std::string& file) {
  bool ok = absl::StartsWith(file, "ps-") && file.size() > 3 && file.size() <= 9;
  for (size_t i = 3; ok && i < file.size(); ++i) ok = absl::ascii_isdigit(file[i]);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("saved shard file \"", file, "\": expected ps-<index>"));
  }
  return absl::OkStatus();
}

}  // namespace pscluster

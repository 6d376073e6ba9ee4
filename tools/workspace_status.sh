#!/usr/bin/env bash
# Bazel's --workspace_status_command (.bazelrc): the commit the binaries report in --version.
# $PSCLUSTER_COMMIT wins (an image built from a tree without .git passes it in); outside a git
# checkout the commit is "unknown". "-dirty" marks uncommitted changes to tracked files.
commit=${PSCLUSTER_COMMIT:-}
if [[ -z $commit ]]; then
  if commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit+="-dirty"
  else
    commit=unknown
  fi
fi
echo "STABLE_PSCLUSTER_COMMIT $commit"

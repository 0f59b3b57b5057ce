#!/bin/sh
# The cancel step of a CI job that ran whalegen-job.sh: cancels the task it recorded, if there is one
# and it has not ended. For cancellations that never signal the job's shell (GitLab's after_script on a
# cancelled job, a GitHub step with `if: cancelled()`). Always exits 0: a cleanup step must not fail.
set -u
[ -s .whalegen-task ] || exit 0
whalegen tasks cancel "$(cat .whalegen-task)" --reason "CI job cancelled" || true

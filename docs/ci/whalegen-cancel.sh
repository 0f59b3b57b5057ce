#!/bin/sh
# The cancel step of a CI job that ran whalegen-job.sh: cancels the task it recorded, if there is one
# and it has not ended. For cancellations that never signal the job's shell (GitLab's after_script on a
# cancelled job, a GitHub step with `if: cancelled()`). Always exits 0: a cleanup step must not fail.
# A plane that is away or busy (exit 69 or 75) is asked again, up to five times: a task left running
# would hold its GPUs until it ends by itself.
set -u
[ -s .whalegen-task ] || exit 0
for try in 1 2 3 4 5; do
  whalegen tasks cancel "$(cat .whalegen-task)" --reason "CI job cancelled"
  case $? in
    69|75) [ "$try" -lt 5 ] && sleep 3 ;;
    *) exit 0 ;;
  esac
done
exit 0

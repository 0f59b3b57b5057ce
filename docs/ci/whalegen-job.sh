#!/bin/sh
# A CI job's body: submit a task to WhaleGen, stream its output, exit with its exit code, and cancel the
# task if the job is cancelled. docs/ci/gitlab-ci.yml and docs/ci/github-actions.yml run it as it is
# (copied into the repository as ci/whalegen-job.sh); tests/whalegen/commands/test_ci_jobs.py runs
# those jobs against a live plane with only `whalegen[client]` installed.
#
#   sh ci/whalegen-job.sh TASK_FILE IDEMPOTENCY_KEY
#
# WHALEGEN_URL and WHALEGEN_TOKEN come from the CI's variables (the token as a masked secret).
# WHALEGEN_WAIT_S (default 3600) bounds the wait: past it the job exits 124 and the task goes on.
# Exit status: the task's own, or the CLI's (docs/ci.md, "Exit codes").
set -u
task_file=$1
key=$2
record=.whalegen-task # the task's id, for the cancel step (whalegen-cancel.sh)

# 1. A cancelled job cancels its task. Runners signal the job's shell (GitHub: SIGINT, then SIGTERM;
#    GitLab: SIGTERM, then its after_script). The traps are set before anything is submitted: a signal
#    during the submit runs the trap once the submit has answered, and the answer names the task. The
#    wait below runs in the background so that a signal reaches the trap at once, not when it ends.
waiter=""
task=""
cancel() {
    [ -n "$waiter" ] && kill "$waiter" 2>/dev/null
    [ -n "$task" ] || task=$(sed -n '1s/^task \([0-9][0-9]*\):.*/\1/p' "$record.out" 2>/dev/null)
    # The cancel step's own retries (asked again while the plane is away or busy) cancel it.
    [ -n "$task" ] && echo "$task" >"$record" && sh "$(dirname "$0")/whalegen-cancel.sh"
    exit "$1"
}
trap 'cancel 130' INT
trap 'cancel 143' TERM

# 2. Submit. The key makes a retried job find the task its first try made instead of making another.
rm -f "$record" "$record.out"
whalegen submit "$task_file" --idempotency-key "$key" >"$record.out"
status=$?
cat "$record.out"
[ "$status" -eq 0 ] || exit "$status"
sed -n '1s/^task \([0-9][0-9]*\):.*/\1/p' "$record.out" >"$record"
task=$(cat "$record")

# 3. Follow it to its end: its output streams into the job's log, and its exit code is the job's.
whalegen tasks wait "$task" --timeout "${WHALEGEN_WAIT_S:-3600}" &
waiter=$!
wait "$waiter"
exit $?
